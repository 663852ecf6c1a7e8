package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
)

// TestAuthorizationMatrix sends every route as each kind of principal and
// checks the status DESIGN.md's scoping gives it: 401 without or with an
// unknown token, 403 for admin routes and hosts out of scope, 404 for
// another owner's run, 2xx otherwise.
func TestAuthorizationMatrix(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { authorizationMatrix(t, kind) })
	}
}

func authorizationMatrix(t *testing.T, kind string) {
	s := newStack(t, kind, stackOptions{})
	h1 := s.addHost(t, "h1", fakehost.Config{}, nil)
	s.probe(t, "h1")
	s.addHost(t, "h2", fakehost.Config{}, nil)
	s.probe(t, "h2")

	principals := []struct {
		name  string
		token string
	}{
		{"no token", ""},
		{"unknown token", "rft_this-token-was-never-minted-000000000000"},
		{"caller without the host", s.mint(t, "nohost", []string{"h2"}, "*")},
		{"caller with the host", s.mint(t, "alice", []string{"h1"}, "*")},
		{"another owner", s.mint(t, "bob", []string{"h1"}, "*")},
		{"admin", adminToken},
	}
	aliceToken := principals[3].token
	aliceRun := s.must(t, http.StatusCreated, "POST", "/fleet/runs", aliceToken, `{"host":"h1","agent":"shell"}`).str("fleetRunId")
	// Each principal's cancel and retry acts on a run of its own (alice's
	// all), so the owner's and the admin's can both be accepted: a run to
	// cancel is live, a run to retry has ended on its host.
	var toCancel, toRetry []string
	for range principals {
		toCancel = append(toCancel, s.must(t, http.StatusCreated, "POST", "/fleet/runs", aliceToken, `{"host":"h1","agent":"shell"}`).str("fleetRunId"))
		a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", aliceToken, `{"host":"h1","agent":"shell"}`)
		one := 1
		h1.SetRun(a.str("childRunId"), hostproto.StatusFailed, &one, "")
		toRetry = append(toRetry, a.str("fleetRunId"))
	}
	s.sweep(t) // the first events mirrored

	const (
		none, unknown, without, with, other, admin = 0, 1, 2, 3, 4, 5
	)
	n := 0
	uniq := func(prefix string) string { n++; return fmt.Sprintf("%s%d", prefix, n) }
	type row struct {
		method, path string
		body         func() string
		// want is the status per principal, in the order above.
		want [6]int
		// check, if set, looks at a 2xx answer's body.
		check func(t *testing.T, principal int, a answer)
	}
	adminOnly := func(ok int) [6]int { return [6]int{401, 401, 403, 403, 403, ok} }
	rows := []row{
		{"GET", "/healthz", nil, [6]int{200, 200, 200, 200, 200, 200}, nil},
		{"GET", "/ui", nil, [6]int{200, 200, 200, 200, 200, 200}, nil}, // the dashboard's page holds no data
		{"GET", "/fleet/hosts", nil, [6]int{401, 401, 200, 200, 200, 200}, func(t *testing.T, p int, a answer) {
			ids := hostIDs(a)
			want := map[int]string{without: "h2", with: "h1", other: "h1", admin: "h1,h2"}[p]
			if ids != want {
				t.Errorf("hosts seen = %s, want %s", ids, want)
			}
		}},
		// Before any host off loopback is registered: the rollup scrapes them all.
		{"GET", "/metrics", nil, [6]int{401, 401, 200, 200, 200, 200}, func(t *testing.T, p int, a answer) {
			want := map[int]string{without: "h2", with: "h1", other: "h1", admin: "del0,del1,del2,del3,del4,del5,h1,h2"}[p]
			if got := rolledUpHosts(a.raw); got != want {
				t.Errorf("metrics of hosts %s, want %s", got, want)
			}
		}},
		{"POST", "/fleet/hosts", func() string {
			return fmt.Sprintf(`{"id":%q,"baseUrl":"https://runner.example","credentialRef":%q}`, uniq("new"), hostCredRef)
		}, adminOnly(201), nil},
		{"POST", "/fleet/hosts/h1/enable", func() string { return `{"enabled":true}` }, adminOnly(200), nil},
		{"POST", "/fleet/hosts/h1/probe", nil, adminOnly(200), nil},
		{"POST", "/fleet/probe", nil, adminOnly(200), nil},
		{"POST", "/fleet/callers", func() string {
			return fmt.Sprintf(`{"ownerId":%q,"allowedHosts":"*","allowedProjects":"*"}`, uniq("minted"))
		}, adminOnly(201), nil},
		{"GET", "/fleet/callers", nil, adminOnly(200), nil},
		{"POST", "/fleet/runs", func() string { return `{"host":"h1","agent":"shell"}` }, [6]int{401, 401, 403, 201, 201, 201}, nil},
		{"GET", "/fleet/runs", nil, [6]int{401, 401, 200, 200, 200, 200}, func(t *testing.T, p int, a answer) {
			runs, _ := a.body["runs"].([]any)
			for _, r := range runs {
				owner := r.(map[string]any)["ownerId"]
				want := map[int]string{without: "nohost", with: "alice", other: "bob"}[p]
				if p != admin && owner != want {
					t.Errorf("%s sees a run of %v", want, owner)
				}
			}
			if p == admin && len(runs) < 2 {
				t.Errorf("admin sees %d runs, want every owner's", len(runs))
			}
		}},
		{"GET", "/fleet/runs/" + aliceRun, nil, [6]int{401, 401, 404, 200, 404, 200}, nil},
		// The verbs and the mirror: scoped like reads.
		// The fake host accepts each: the owner's and the admin's verbs are
		// accepted: true; the others never reach it.
		{"POST", "/fleet/runs/" + aliceRun + "/input", func() string { return `{"input":"y\n"}` }, [6]int{401, 401, 404, 200, 404, 200}, accepted},
		{"POST", "/fleet/runs/{toCancel}/cancel", nil, [6]int{401, 401, 404, 200, 404, 200}, accepted},
		{"POST", "/fleet/runs/{toRetry}/retry", nil, [6]int{401, 401, 404, 200, 404, 200}, accepted},
		{"GET", "/fleet/runs/" + aliceRun + "/events", nil, [6]int{401, 401, 404, 200, 404, 200}, func(t *testing.T, p int, a answer) {
			if evs, _ := a.body["events"].([]any); len(evs) == 0 {
				t.Errorf("no events: %s", a.raw)
			}
		}},
		{"GET", "/fleet/runs/" + aliceRun + "/egress?verify=true", nil, [6]int{401, 401, 404, 200, 404, 200}, func(t *testing.T, p int, a answer) {
			if _, ok := a.body["verification"]; !ok {
				t.Errorf("no verification: %s", a.raw)
			}
		}},
		// The alerts listing spans every owner: admins only, refused as the
		// admin routes are.
		{"GET", "/fleet/runs?alerts=true", nil, adminOnly(200), nil},
		// The stream: the same scope, on the stream handler.
		{"GET", "/fleet/runs/" + aliceRun + "/stream", nil, [6]int{401, 401, 404, 200, 404, 200}, nil},
	}
	// Deletions go last, each on its own target so every principal's
	// attempt meets an existing one.
	for i := range principals {
		s.addHost(t, fmt.Sprintf("del%d", i), fakehost.Config{}, nil)
		s.mint(t, fmt.Sprintf("revoke%d", i), "*", "*")
	}
	p := 0
	rows = append(rows,
		row{"DELETE", "/fleet/hosts/del%d", nil, adminOnly(200), nil},
		row{"DELETE", "/fleet/callers/revoke%d", nil, adminOnly(200), nil},
	)

	for _, r := range rows {
		for i, pr := range principals {
			p = i
			path := r.path
			if strings.Contains(path, "%d") {
				path = fmt.Sprintf(path, i)
			}
			path = strings.NewReplacer("{toCancel}", toCancel[i], "{toRetry}", toRetry[i]).Replace(path)
			body := ""
			if r.body != nil {
				body = r.body()
			}
			var a answer
			if strings.HasSuffix(path, "/stream") {
				a = s.streamStatus(t, path, pr.token)
			} else {
				a = s.do(t, r.method, path, pr.token, body)
			}
			if a.status != r.want[i] {
				t.Errorf("%s %s as %s: %d %s, want %d", r.method, path, pr.name, a.status, a.raw, r.want[i])
				continue
			}
			if a.status == 401 && (a.errorText() == "" || a.body["code"] != "unauthenticated") {
				t.Errorf("%s %s as %s: 401 body %s", r.method, path, pr.name, a.raw)
			}
			if a.status == 403 && r.want[admin] != 403 && r.want[with] == 403 && a.body["code"] != "admin_required" {
				t.Errorf("%s %s as %s: 403 body %s, want admin_required", r.method, path, pr.name, a.raw)
			}
			if a.status < 300 && r.check != nil {
				r.check(t, p, a)
			}
		}
	}

	// A caller that owns a run on a host no longer in its allowedHosts
	// (revoked, then re-minted with a smaller scope): every per-run route
	// is 403 naming the host, and the listing leaves the run out.
	carol := s.mint(t, "carol", []string{"h1", "h2"}, "*")
	onH2 := s.must(t, http.StatusCreated, "POST", "/fleet/runs", carol, `{"host":"h2","agent":"shell"}`).str("fleetRunId")
	onH1 := s.must(t, http.StatusCreated, "POST", "/fleet/runs", carol, `{"host":"h1","agent":"shell"}`).str("fleetRunId")
	s.must(t, http.StatusOK, "DELETE", "/fleet/callers/carol", adminToken, "")
	carol = s.mint(t, "carol", []string{"h1"}, "*")
	for _, r := range []struct{ method, path, body string }{
		{"GET", "", ""}, {"POST", "/input", `"y"`}, {"POST", "/cancel", ""}, {"POST", "/retry", ""}, {"GET", "/events", ""},
		{"GET", "/egress", ""}, {"GET", "/stream", ""},
	} {
		path := "/fleet/runs/" + onH2 + r.path
		var a answer
		if r.path == "/stream" {
			a = s.streamStatus(t, path, carol)
		} else {
			a = s.do(t, r.method, path, carol, r.body)
		}
		if a.status != http.StatusForbidden || a.body["code"] != "out_of_scope" || !strings.Contains(a.errorText(), `"h2"`) {
			t.Errorf("%s %s by its owner without h2 in scope: %d %s, want 403 naming h2", r.method, path, a.status, a.raw)
		}
	}
	listed := s.must(t, http.StatusOK, "GET", "/fleet/runs", carol, "")
	if runs, _ := listed.body["runs"].([]any); len(runs) != 1 || runs[0].(map[string]any)["fleetRunId"] != onH1 {
		t.Errorf("carol's listing without h2 in scope: %s, want only %s", listed.raw, onH1)
	}
	s.must(t, http.StatusOK, "GET", "/fleet/runs/"+onH2, adminToken, "")

	// A revoked caller's token stops working.
	revoked := s.mint(t, "short-lived", "*", "*")
	s.must(t, 200, "GET", "/fleet/runs", revoked, "")
	s.must(t, 200, "DELETE", "/fleet/callers/short-lived", adminToken, "")
	s.must(t, 401, "GET", "/fleet/runs", revoked, "")
}

func hostIDs(a answer) string {
	hosts, _ := a.body["hosts"].([]any)
	var ids []string
	for _, h := range hosts {
		id := h.(map[string]any)["id"].(string)
		if id == "h1" || id == "h2" {
			ids = append(ids, id)
		}
	}
	return strings.Join(ids, ",")
}

// accepted checks that a verb the host took is accepted: true, as DESIGN.md
// maps a 2xx (only the owner and the admin get this far).
func accepted(t *testing.T, _ int, a answer) {
	if a.body["accepted"] != true {
		t.Errorf("not accepted: %s", a.raw)
	}
}

// rolledUpHosts lists the hosts of a rollup's runfleet_rollup_up series.
func rolledUpHosts(text string) string {
	var hosts []string
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, `runfleet_rollup_up{host="`); ok {
			h, _, _ := strings.Cut(rest, `"`)
			hosts = append(hosts, h)
		}
	}
	return strings.Join(hosts, ",")
}

// streamStatus opens a stream and answers its status: a refusal's body, or
// for a stream, the status once the snapshot came (the stream is closed).
func (s *stack) streamStatus(t *testing.T, path, token string) answer {
	t.Helper()
	req, _ := http.NewRequest("GET", s.srv.URL+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		a.raw = string(raw)
		json.Unmarshal(raw, &a.body)
		return a
	}
	c := &streamClient{t: t, clk: s.clk, parked: s.parked, ch: ssetest.Read(resp.Body)}
	_, snap := c.until("snapshot")
	a.raw = snap.Data
	return a
}
