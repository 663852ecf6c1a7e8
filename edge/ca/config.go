package ca

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
)

// The defaults of Config's timing, and of edge.json's ca section.
const (
	DefaultLifetime        = 8760 * time.Hour // a year
	DefaultSuccessorWindow = 2160 * time.Hour // 90 days
	DefaultSwitchBefore    = 24 * time.Hour
	DefaultLeafLifetime    = 168 * time.Hour
	DefaultReviewInterval  = time.Hour
)

// Config configures an Authority. Open fills the zero values with the
// defaults documented on each field and then validates it.
type Config struct {
	// Dir is where the CA keeps its files (the caller passes <dataDir>/ca);
	// created 0700. Required.
	Dir string

	// Lifetime of each CA certificate; zero = DefaultLifetime.
	Lifetime time.Duration
	// SuccessorWindow: inside the signer's last SuccessorWindow a successor
	// is minted and joins the bundle; zero = DefaultSuccessorWindow.
	// Shorter than Lifetime.
	SuccessorWindow time.Duration
	// SwitchBefore: the signer hands over to its successor this long before
	// its end; zero = DefaultSwitchBefore. Shorter than SuccessorWindow, so
	// every task that installed a bundle in the last
	// SuccessorWindow-SwitchBefore trusts the new signer when it takes over.
	SwitchBefore time.Duration
	// LeafLifetime of a leaf, never past its signer's NotAfter; zero =
	// DefaultLeafLifetime.
	LeafLifetime time.Duration

	// Sealer seals the CA private keys at rest. Required.
	Sealer Sealer
	// Clock is the time every rotation and leaf decision reads; zero = the
	// wall clock.
	Clock clock.Clock
	// Rand is the source of serial numbers; zero = crypto/rand.Reader.
	// (Go 1.26 generates keys and ECDSA signatures from the system's secure
	// source whatever reader it is given.)
	Rand io.Reader
	// Logger receives rotation and delivery events; zero = discard.
	Logger *slog.Logger

	// AllowName reports which server names may get a leaf (the proxy
	// supplies it: the names some task's keys may reach). It is called on
	// every handshake and on every issuance, from the handshake's goroutine,
	// so it must be fast and safe for concurrent use. Nil = no name (but
	// those Authority.AdmitName holds).
	AllowName func(name string) bool

	// ReviewInterval is how often the CA dates are reviewed and a failed
	// trust delivery retried, besides the reviews that handshakes, Bundle and
	// Status make when a transition is due; zero = 1h, or a quarter of
	// SuccessorWindow-SwitchBefore when that is shorter (lifetimes configured
	// in minutes). It must be shorter than SuccessorWindow-SwitchBefore.
	ReviewInterval time.Duration
}

// withDefaults returns c with every zero field filled.
func (c Config) withDefaults() Config {
	setD := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	setD(&c.Lifetime, DefaultLifetime)
	setD(&c.SuccessorWindow, DefaultSuccessorWindow)
	setD(&c.SwitchBefore, DefaultSwitchBefore)
	setD(&c.LeafLifetime, DefaultLeafLifetime)
	if c.ReviewInterval == 0 {
		c.ReviewInterval = DefaultReviewInterval
		if overlap := (c.SuccessorWindow - c.SwitchBefore) / 4; overlap > 0 && overlap < c.ReviewInterval {
			c.ReviewInterval = overlap
		}
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks what Open needs, naming the field at fault.
func (c Config) Validate() error {
	errs := []error{c.validateTiming()}
	if c.Sealer == nil {
		errs = append(errs, errors.New("ca: Sealer is required"))
	}
	return errors.Join(errs...)
}

// validateTiming is Validate without the Sealer, for Inspect.
func (c Config) validateTiming() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("ca: "+format, args...)) }
	if c.Dir == "" {
		bad("Dir is required")
	}
	for name, d := range map[string]time.Duration{
		"Lifetime": c.Lifetime, "SuccessorWindow": c.SuccessorWindow, "SwitchBefore": c.SwitchBefore,
		"LeafLifetime": c.LeafLifetime, "ReviewInterval": c.ReviewInterval,
	} {
		if d <= 0 {
			bad("%s must be positive, not %v", name, d)
		}
	}
	if c.SuccessorWindow >= c.Lifetime {
		bad("SuccessorWindow (%v) must be shorter than Lifetime (%v)", c.SuccessorWindow, c.Lifetime)
	}
	if c.SwitchBefore >= c.SuccessorWindow {
		bad("SwitchBefore (%v) must be shorter than SuccessorWindow (%v)", c.SwitchBefore, c.SuccessorWindow)
	}
	if overlap := c.SuccessorWindow - c.SwitchBefore; c.ReviewInterval > 0 && overlap > 0 && c.ReviewInterval >= overlap {
		bad("ReviewInterval (%v) must be shorter than SuccessorWindow-SwitchBefore (%v), or a successor could reach tasks too late", c.ReviewInterval, overlap)
	}
	return errors.Join(errs...)
}

// timing is the part of Config that rotation decisions read.
type timing struct {
	lifetime, successorWindow, switchBefore time.Duration
}

func (c Config) timing() timing {
	return timing{lifetime: c.Lifetime, successorWindow: c.SuccessorWindow, switchBefore: c.SwitchBefore}
}
