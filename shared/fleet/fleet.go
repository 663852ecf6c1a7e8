// Package fleet owns Fleet's domain: the host registry, probes, routing,
// idempotent dispatch and the recovery of dispatches whose answer was lost,
// the verbs forwarded to a run's host, the event and egress ledger mirror
// with the sweep that keeps live runs current (and the ledger's
// verification), and the scrape behind the metrics rollup, over a
// store.Store and the host protocol client. The API handler (package api),
// the stream (package stream) and the scheduled jobs (package scheduled)
// call it; it knows nothing of HTTP.
//
// The host protocol's wire types and the store's records meet here only,
// in records.go: each is mapped to the other in one place.
//
// Routing reads the routing view the probe writes (BuildRouteView; its
// bound, cost and staleness: DESIGN.md, section "Routing"), re-reading
// the host it chose, so a dispatch's reads do not grow with the fleet.
//
// Errors a caller can act on are *Error with a Kind; anything else is a fault.
package fleet

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/emf"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// Defaults for Config's zero values.
const (
	DefaultHostTimeout      = 10 * time.Second
	DefaultProbeTimeout     = 5 * time.Second
	DefaultProbeMaxAge      = 30 * time.Minute
	DefaultProbeConcurrency = 8
	DefaultRetention        = 30 * 24 * time.Hour
	// IdempotencyTTL is how long an idempotency key binds its first run.
	IdempotencyTTL = 24 * time.Hour
	// LostGrace is how long past its deadline a dispatching run the host
	// does not know waits before it is declared dispatch_lost: the host
	// refuses a start after the deadline, and the minute covers clock skew.
	LostGrace = time.Minute
)

// Config configures a Fleet.
type Config struct {
	// Store holds Fleet's state. Required.
	Store store.Store
	// Credentials resolves hosts' credentialRefs. Required.
	Credentials credentials.Source
	// Logger receives faults and decisions. Required (use a discard
	// handler in tests).
	Logger *slog.Logger
	// Clock reads the time; nil is the wall clock.
	Clock clock.Clock
	// Random makes run ids and tokens; nil is crypto/rand.
	Random io.Reader
	// DialContext dials hosts; nil is a net.Dialer.
	DialContext hostproto.DialContextFunc
	// HostTimeout bounds a host call and sets a dispatch's deadline; zero
	// is DefaultHostTimeout.
	HostTimeout time.Duration
	// ProbeTimeout bounds one probe; zero is DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// ProbeMaxAge is the age past which a probe is stale for routing; zero
	// is DefaultProbeMaxAge.
	ProbeMaxAge time.Duration
	// ProbeConcurrency bounds concurrent probes; zero is
	// DefaultProbeConcurrency.
	ProbeConcurrency int
	// Retention keeps ended runs; zero is DefaultRetention.
	Retention time.Duration
	// RepoURLs is the repository map (repository -> clone URL); nil is empty.
	RepoURLs map[string]string
	// MaxEventPageBytes bounds a host's answer to one events page (and
	// one egress ledger page); zero is hostproto.DefaultMaxEventPageBytes.
	// A larger answer is asked again for fewer events (see the mirror).
	MaxEventPageBytes int64
	// Broker mints the values of brokered keys at dispatch and keeps live
	// runs' values fresh; nil: no key is brokered.
	Broker Broker
	// Metrics receives Fleet's own broker metric lines (fresh values a
	// host did not take: MetricBrokerFailures); the broker's own events
	// reach the metrics through its hook (BrokerMetrics). Nil: none.
	Metrics *emf.Writer
	// Waker delivers wakes to FillHosts (queue.go); nil: runs that wait
	// are started only by the probe pass's own FillHosts (tests, tools).
	Waker Waker
	// QueueDefault is the wait of a dispatch that does not say
	// (RUNFLEET_QUEUE_TIMEOUT); zero: such a dispatch never waits.
	QueueDefault time.Duration
	// QueueMaxTimeout bounds a dispatch's wait (RUNFLEET_QUEUE_MAX_TIMEOUT);
	// zero is DefaultQueueMaxTimeout.
	QueueMaxTimeout time.Duration
	// ProbeRefresh is the longest a host's recorded probe goes unwritten
	// when nothing material changed (RUNFLEET_PROBE_REFRESH); zero is
	// ProbeMaxAge/2. Must be under ProbeMaxAge.
	ProbeRefresh time.Duration
	// CapacityClasses are routing classes the capacity figures always
	// report (RUNFLEET_CAPACITY_CLASSES), even with nothing queued.
	CapacityClasses []string
	// EgressBatch is how many records must be pending on a live run's
	// host before the sweep mirrors its egress ledger (egress.go); zero is
	// DefaultEgressBatch.
	EgressBatch int
}

// Validate reports a missing required field.
func (c Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("fleet: Config.Store is required"))
	}
	if c.Credentials == nil {
		errs = append(errs, errors.New("fleet: Config.Credentials is required"))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("fleet: Config.Logger is required"))
	}
	maxWait := c.QueueMaxTimeout
	if maxWait <= 0 {
		maxWait = DefaultQueueMaxTimeout
	}
	if c.QueueDefault < 0 || c.QueueDefault > maxWait {
		errs = append(errs, fmt.Errorf("fleet: Config.QueueDefault %s: want 0 (no waiting) to the longest wait, %s", c.QueueDefault, maxWait))
	}
	return errors.Join(errs...)
}

// Fleet is the domain. It is safe for concurrent use.
type Fleet struct {
	cfg   Config
	store store.Store
	log   *slog.Logger
	clock clock.Clock

	mu         sync.Mutex
	transports map[string]*http.Transport // by sha256(caPem); "" is the system roots

	// ledgers remembers each live run's ledger cursor (egress.go).
	ledgers ledgerCursors
	// probed remembers when each host was last probed (probe.go).
	probed probeMemory
	// queued remembers whether any run waited when last read (queue.go).
	queued queueMemory
}

// New checks cfg, fills its defaults and returns a Fleet.
func New(cfg Config) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Random == nil {
		cfg.Random = rand.Reader
	}
	if cfg.HostTimeout <= 0 {
		cfg.HostTimeout = DefaultHostTimeout
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	if cfg.ProbeMaxAge <= 0 {
		cfg.ProbeMaxAge = DefaultProbeMaxAge
	}
	if cfg.ProbeConcurrency <= 0 {
		cfg.ProbeConcurrency = DefaultProbeConcurrency
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.EgressBatch <= 0 {
		cfg.EgressBatch = DefaultEgressBatch
	}
	if cfg.QueueMaxTimeout <= 0 {
		cfg.QueueMaxTimeout = DefaultQueueMaxTimeout
	}
	return &Fleet{
		cfg:        cfg,
		store:      cfg.Store,
		log:        cfg.Logger,
		clock:      cfg.Clock,
		transports: map[string]*http.Transport{},
	}, nil
}

// Store is the store the Fleet was built on.
func (f *Fleet) Store() store.Store { return f.store }

// HostTimeout is the configured bound of a host call.
func (f *Fleet) HostTimeout() time.Duration { return f.cfg.HostTimeout }

// transport returns the shared transport for hosts trusting caPEM, so
// connections are reused across calls (and warm Lambda invocations).
func (f *Fleet) transport(caPEM string) (*http.Transport, error) {
	key := ""
	if caPEM != "" {
		sum := sha256.Sum256([]byte(caPEM))
		key = hex.EncodeToString(sum[:])
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := f.transports[key]; ok {
		return t, nil
	}
	t, err := hostproto.NewTransport(caPEM, f.cfg.DialContext)
	if err != nil {
		return nil, err
	}
	f.transports[key] = t
	return t, nil
}
