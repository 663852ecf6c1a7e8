package policy

import (
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/runspec"
)

// A key takes its value from Fleet only when it says "source": "fleet",
// and only a key sent as its value may: an aws or ssh key's value never
// travels. Issue 33.
func TestCompileSource(t *testing.T) {
	fleet := key([]string{"api.github.com"}, nil, "ghs_", 0)
	fleet.Source = "fleet"
	host := key([]string{"api.example"}, nil, "", 0)
	p, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{"acme": {Keys: map[string]config.KeyPolicy{"GH": fleet, "API": host}}}})
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := p.Key(KeyRef{"acme", "GH"}); k.Source != SourceFleet {
		t.Errorf(`"source": "fleet" compiled to %v`, k.Source)
	}
	if k, _ := p.Key(KeyRef{"acme", "API"}); k.Source != SourceHost {
		t.Errorf("no source compiled to %v, want the host's", k.Source)
	}
	declared, err := runspec.Request{Agent: "shell", Secrets: []runspec.Secret{{ProjectID: "acme", Key: "GH", Domains: []string{"api.github.com"}}}}.Declare()
	if err != nil {
		t.Fatal(err)
	}
	if granted, _ := p.Grant(declared); len(granted) != 1 || granted[0].Source != SourceFleet {
		t.Errorf("the grant of a fleet key: %+v", granted)
	}

	aws := config.KeyPolicy{Kind: KindAWS, Domains: []string{"sts.amazonaws.com"}, Source: "fleet", AWS: &config.AWSKey{Regions: []string{"us-east-1"}, Services: []string{"sts"}}}
	ssh := config.KeyPolicy{Kind: KindSSH, Domains: []string{"github.com:22"}, Source: "fleet"}
	awsNoKind := config.KeyPolicy{Domains: []string{"sts.amazonaws.com"}, Source: "fleet", AWS: &config.AWSKey{Regions: []string{"us-east-1"}, Services: []string{"sts"}}}
	other := key([]string{"api.example"}, nil, "", 0)
	other.Source = "vault"
	for name, tc := range map[string]struct {
		k    config.KeyPolicy
		want string
	}{
		"aws":          {aws, `policy.projects.acme.keys.K.source: "fleet" is only for a key sent as its value, not one of "kind": "aws"`},
		"aws, no kind": {awsNoKind, `policy.projects.acme.keys.K.source: "fleet" is only for a key sent as its value, not one of "kind": "aws"`},
		"ssh":          {ssh, `policy.projects.acme.keys.K.source: "fleet" is only for a key sent as its value, not one of "kind": "ssh"`},
		"unknown":      {other, `policy.projects.acme.keys.K.source: "vault": write "fleet" for a value Fleet sends with each run, or omit it`},
	} {
		_, err := Compile(one("acme", "K", tc.k))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", name, err, tc.want)
		}
	}
}

// CheckFleetValues: a start carries a value for exactly the declared keys
// the policy takes from Fleet; a PUT's values are checked one by one.
func TestCheckFleetValues(t *testing.T) {
	fleet := key([]string{"api.github.com"}, nil, "", 0)
	fleet.Source = "fleet"
	p, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{"acme": {Keys: map[string]config.KeyPolicy{
		"GH": fleet, "API": key([]string{"api.example"}, nil, "", 0),
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	gh, api, gone := KeyRef{"acme", "GH"}, KeyRef{"acme", "API"}, KeyRef{"acme", "GONE"}
	declared := []runspec.Declared{{ProjectID: "acme", Key: "GH"}, {ProjectID: "acme", Key: "API"}}
	for name, tc := range map[string]struct {
		given    []KeyRef
		complete bool
		want     string // "" for none
	}{
		"a start with the fleet key's value":           {[]KeyRef{gh}, true, ""},
		"a start without it":                           {nil, true, "the host's policy takes acme/GH from Fleet, and Fleet sent no value for it (Fleet has no recipe for it)"},
		"a start with a value for a host key":          {[]KeyRef{gh, api}, true, "the host's policy takes acme/API from its own sources, not from Fleet"},
		"a value for a key the policy lacks":           {[]KeyRef{gh, gone}, true, "this host's policy does not proxy acme/GONE"},
		"a PUT of the fleet key":                       {[]KeyRef{gh}, false, ""},
		"a PUT of a host key":                          {[]KeyRef{api}, false, "the host's policy takes acme/API from its own sources, not from Fleet"},
		"a retry, which carries none, is not refused":  {nil, false, ""},
		"a value for a host key is named before a gap": {[]KeyRef{api}, true, "acme/API from its own sources"},
	} {
		r := p.CheckFleetValues(declared, tc.given, tc.complete)
		switch {
		case tc.want == "" && r != nil:
			t.Errorf("%s: refused %q", name, r.Reason)
		case tc.want != "" && (r == nil || !strings.Contains(r.Reason, tc.want)):
			t.Errorf("%s: refusal %v, want one containing %q", name, r, tc.want)
		}
	}
}
