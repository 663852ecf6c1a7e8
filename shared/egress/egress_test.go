package egress

import (
	"crypto/ed25519"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

// ledger builds a sealed ledger of n records of runID, as edge writes one.
func ledger(t *testing.T, runID string, n int, key ed25519.PrivateKey) ([]Record, *Seal) {
	t.Helper()
	prev := Genesis(runID)
	ts := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	var records []Record
	for i := 1; i <= n; i++ {
		r := Record{Seq: int64(i), TS: ts.Add(time.Duration(i) * time.Millisecond), Via: ViaProxy, Authority: "api.example.test:443",
			Method: "GET", Path: "/v1/items?page=*", Status: 200, BytesUp: 10, BytesDown: int64(100 * i), DurationUs: 1500,
			Keys: []string{"acme/API_KEY"}, Action: Substituted}
		canonical, err := Canonical(r)
		if err != nil {
			t.Fatal(err)
		}
		prev = Next(prev, canonical)
		r.Hash = hex.EncodeToString(prev[:])
		records = append(records, r)
	}
	seal := Sign(key, runID, int64(n), prev, ts)
	return records, &seal
}

func key(seed byte) ed25519.PrivateKey {
	s := make([]byte, ed25519.SeedSize)
	s[0] = seed
	return ed25519.NewKeyFromSeed(s)
}

func TestVerifyHoldsForAnUntouchedLedger(t *testing.T) {
	k := key(1)
	records, seal := ledger(t, "run-1", 5, k)
	v := Verify("run-1", records, seal, k.Public().(ed25519.PublicKey))
	if !v.OK || v.Records != 5 || !v.Sealed || v.Problem != "" {
		t.Fatalf("untouched ledger: %+v", v)
	}
}

func TestVerifyNamesWhatWasTamperedWith(t *testing.T) {
	k := key(1)
	trusted := k.Public().(ed25519.PublicKey)
	for _, tc := range []struct {
		name    string
		tamper  func([]Record, *Seal) ([]Record, *Seal, ed25519.PublicKey)
		seq     int64
		problem string
	}{
		{"one field of one record", func(r []Record, s *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			r[2].Status = 201
			return r, s, trusted
		}, 3, "does not match its hash"},
		{"a record's keys", func(r []Record, s *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			r[0].Keys = nil
			return r, s, trusted
		}, 1, "does not match its hash"},
		{"a record dropped", func(r []Record, s *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			return append(r[:1:1], r[2:]...), s, trusted
		}, 2, "missing or out of order"},
		{"two records swapped", func(r []Record, s *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			r[1], r[2] = r[2], r[1]
			return r, s, trusted
		}, 2, "missing or out of order"},
		{"swapped and renumbered", func(r []Record, s *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			r[1], r[2] = r[2], r[1]
			r[1].Seq, r[2].Seq = 2, 3
			return r, s, trusted
		}, 2, "does not match its hash"},
		{"the last record dropped", func(r []Record, s *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			return r[:4], s, trusted
		}, 0, "the seal covers 5 records, the ledger holds 4"},
		{"signed by another host's key", func(r []Record, _ *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			records, seal := ledger(t, "run-1", 5, key(2))
			return records, seal, trusted
		}, 0, "does not verify with the host's ledger key (it names another key)"},
		{"another run's ledger", func(_ []Record, _ *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			records, seal := ledger(t, "run-2", 5, k)
			return records, seal, trusted
		}, 1, "does not match its hash"},
		{"unsealed", func(r []Record, _ *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			return r, nil, trusted
		}, 0, "not sealed yet"},
		{"no key known", func(r []Record, s *Seal) ([]Record, *Seal, ed25519.PublicKey) {
			return r, s, nil
		}, 0, "no ledger key is known"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			records, seal := ledger(t, "run-1", 5, k)
			records, seal, trusted := tc.tamper(records, seal)
			v := Verify("run-1", records, seal, trusted)
			if v.OK || v.FailedSeq != tc.seq || !strings.Contains(v.Problem, tc.problem) {
				t.Fatalf("got %+v, want failure at %d saying %q", v, tc.seq, tc.problem)
			}
		})
	}
}

func TestPublicKeyRoundTrips(t *testing.T) {
	pub := key(3).Public().(ed25519.PublicKey)
	got, err := ParsePublicKey(FormatPublicKey(pub))
	if err != nil || !got.Equal(pub) {
		t.Fatalf("round trip: %v %v", got, err)
	}
	for _, bad := range []string{"", "rsa:AAAA", "ed25519:!!", "ed25519:AAAA"} {
		if _, err := ParsePublicKey(bad); err == nil {
			t.Errorf("ParsePublicKey(%q) accepted it", bad)
		}
	}
}

func TestTallyCountsEveryDecisionIncludingDropped(t *testing.T) {
	var tl Tally
	tl.Add(Record{Authority: "a:443", Action: Substituted, Keys: []string{"p/B", "p/A"}, BytesUp: 1, BytesDown: 2})
	tl.Add(Record{Authority: "a:443", Action: Blocked, Alert: AlertRealValue, Keys: []string{"p/A"}})
	tl.Add(Record{Authority: "b:443", Action: Warned, Rule: "r"})
	tl.Add(Record{Authority: "x.test", Via: ViaDNS, Action: Denied})
	tl.AddDropped(Record{Authority: "b:443", Action: Forwarded, BytesDown: 5})
	tl.Add(Record{Action: Dropped, Dropped: 1})
	s := tl.Summary()
	if s.Requests != 5 || s.Blocked != 2 || s.Warned != 1 || s.Alerts != 1 || s.Dropped != 1 || s.BytesUp != 1 || s.BytesDown != 7 {
		t.Fatalf("summary %+v", s)
	}
	if len(s.Authorities) != 3 || s.Authorities[0].Authority != "a:443" || s.Authorities[0].Requests != 2 ||
		s.Authorities[0].Blocked != 1 || strings.Join(s.Authorities[0].Keys, ",") != "p/A,p/B" || s.Authorities[1].Authority != "b:443" {
		t.Fatalf("authorities %+v", s.Authorities)
	}
}

func TestTallyStaysBounded(t *testing.T) {
	var tl Tally
	for i := range MaxTallied + 10 {
		tl.Add(Record{Authority: strings.Repeat("x", i%7) + string(rune('a'+i%26)) + hex.EncodeToString([]byte{byte(i), byte(i >> 8)}), Action: Forwarded})
	}
	s := tl.Summary()
	if len(tl.Authorities) != MaxTallied || len(s.Authorities) != MaxAuthorities || s.OtherAuthorities != int64(MaxTallied+10-MaxAuthorities) {
		t.Fatalf("kept %d, summary %d, other %d", len(tl.Authorities), len(s.Authorities), s.OtherAuthorities)
	}
}
