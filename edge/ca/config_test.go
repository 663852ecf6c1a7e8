package ca

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigDefaultsAndValidate(t *testing.T) {
	sealer, err := NewFileSealer(filepath.Join(t.TempDir(), "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	d := Config{Dir: "/x", Sealer: sealer}.withDefaults()
	if d.Lifetime != 8760*time.Hour || d.SuccessorWindow != 2160*time.Hour || d.SwitchBefore != 24*time.Hour ||
		d.LeafLifetime != 168*time.Hour || d.ReviewInterval != time.Hour || d.Clock == nil || d.Rand == nil || d.Logger == nil {
		t.Fatalf("defaults: %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
	short := Config{Dir: "/x", Sealer: sealer, Lifetime: 10 * time.Minute, SuccessorWindow: 4 * time.Minute, SwitchBefore: time.Minute}.withDefaults()
	if short.ReviewInterval != 45*time.Second {
		t.Fatalf("ReviewInterval for lifetimes in minutes = %v, want a quarter of successorWindow-switchBefore", short.ReviewInterval)
	}

	tests := []struct {
		name string
		edit func(*Config)
		says string
	}{
		{"no dir", func(c *Config) { c.Dir = "" }, "Dir is required"},
		{"no sealer", func(c *Config) { c.Sealer = nil }, "Sealer is required"},
		{"negative leaf lifetime", func(c *Config) { c.LeafLifetime = -time.Hour }, "LeafLifetime must be positive"},
		{"window as long as the lifetime", func(c *Config) { c.SuccessorWindow = c.Lifetime }, "SuccessorWindow (8760h0m0s) must be shorter than Lifetime"},
		{"switch not inside the window", func(c *Config) { c.SwitchBefore = c.SuccessorWindow }, "SwitchBefore (2160h0m0s) must be shorter than SuccessorWindow"},
		{"reviews too rare for the overlap", func(c *Config) { c.ReviewInterval = 2136 * time.Hour }, "ReviewInterval (2136h0m0s) must be shorter than SuccessorWindow-SwitchBefore"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := d
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Validate: %v; want it to say %q", err, tc.says)
			}
		})
	}
}
