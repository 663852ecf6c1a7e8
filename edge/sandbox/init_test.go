package sandbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSpecRefusesWhatWouldRunAsRootOrOffPath(t *testing.T) {
	good := Spec{UID: 65534, GID: 1879048200, Dir: "/srv/work/run-1/work", Path: "/usr/bin/sh", Argv: []string{"sh"},
		Private: []Mount{{Target: "/tmp", Source: "/srv/work/run-1/tmp"}}, Keep: []string{"/srv/work/run-1"},
		Tmpfs: []Tmpfs{{Target: "/dev/shm", Bytes: 1 << 20}}, Hide: []string{"/run"},
		Trust: &Trust{File: "/srv/work/run-1/trust/trust.pem", Replace: []string{"/etc/ssl/certs/ca-certificates.crt"}}}
	with := func(change func(*Spec)) Spec {
		s := good
		change(&s)
		return s
	}
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"a valid spec", good, ""},
		{"root's uid", with(func(s *Spec) { s.UID = 0 }), "as root"},
		{"root's group", with(func(s *Spec) { s.GID = 0 }), "as root"},
		{"no agent", with(func(s *Spec) { s.Argv = nil }), "no agent"},
		{"a relative working dir", with(func(s *Spec) { s.Dir = "work" }), "no agent or working dir"},
		{"a kept path with dot-dots", with(func(s *Spec) { s.Keep = []string{"/srv/work/../etc"} }), "absolute and clean"},
		{"a tmpfs without a size", with(func(s *Spec) { s.Tmpfs = []Tmpfs{{Target: "/run/lock"}} }), "no size"},
		{"a relative tmpfs", with(func(s *Spec) { s.Tmpfs = []Tmpfs{{Target: "run/lock", Bytes: 1}} }), "absolute and clean"},
		{"a hidden dir with dot-dots", with(func(s *Spec) { s.Hide = []string{"/run/../etc"} }), "absolute and clean"},
		{"a trust file with dot-dots", with(func(s *Spec) { s.Trust = &Trust{File: "/srv/work/../etc/passwd"} }), "absolute and clean"},
		{"a relative trust store", with(func(s *Spec) { s.Trust = &Trust{File: "/srv/t.pem", Replace: []string{"cert.pem"}} }), "absolute and clean"},
		{"a private dir with dot-dots", with(func(s *Spec) { s.Private = []Mount{{Target: "/tmp/../etc", Source: "/srv"}} }), "absolute and clean"},
		{"a file made in /", with(func(s *Spec) { s.Files = []Mount{{Target: "/known_hosts", Source: "/srv/k", Make: true}} }), "cannot be rebuilt"},
		{"a file made in /etc/ssh", with(func(s *Spec) { s.Files = []Mount{{Target: "/etc/ssh/ssh_known_hosts", Source: "/srv/k", Make: true}} }), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := json.Marshal(tt.spec)
			path := filepath.Join(t.TempDir(), "spec")
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = readSpec(f)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("readSpec = %v, want %q", err, tt.want)
			}
		})
	}
}
