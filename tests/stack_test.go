package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapp"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

var moto *motoserver.Server

func TestMain(m *testing.M) {
	// The tests that run an edge host in this process (as root) start its
	// tasks through this binary as their init (runner.DefaultTaskInit).
	if len(os.Args) > 1 && os.Args[1] == sandbox.InitArg {
		syscall.Exit(sandbox.Main()) // without the race detector's pause at exit
	}
	code := motoserver.Run(m, func(s *motoserver.Server) { moto = s })
	built.remove()
	os.Exit(code)
}

const (
	adminToken = "admin-token-for-tests-0123456789"
	// Every fake host accepts fakehost's default credential; one ref resolves it.
	hostCredRef = "fleet-hosts"
	hostToken   = "host-token"
)

// storeKinds are the two stores every store-sensitive test runs against.
var storeKinds = []string{"bolt", "dynamodb"}

// stack is Fleet as deployed: fleetapp-assembled, the api handler behind the
// net/http adapter and the stream handler at its path (as the local stack
// serves them) on a real loopback server, on bbolt or on DynamoDB
// (moto_server), with a fake clock shared with its fake hosts.
type stack struct {
	app   *fleetapp.App
	srv   *httptest.Server
	clk   *clock.Fake
	meter *dynamostore.Meter
	// parked receives each time a stream session waits on its timer (the
	// fake clock may move then; see streamClient).
	parked chan struct{}
}

type stackOptions struct {
	hostTimeout time.Duration
	repoURLs    map[string]string
	meter       *dynamostore.Meter
	// realClock runs Fleet on the wall clock, for a real edge (its run
	// deadlines are wall-clock ones); the stack's clk is then nil.
	realClock bool
	// log receives Fleet's JSON log lines; nil discards them.
	log io.Writer
	// hostCredentials are more credentialRefs for the credentials file.
	hostCredentials map[string]string
	// aws, when set, adjusts the AWS configuration Fleet's clients are
	// built from (a transport that loses responses, a retryer).
	aws func(aws.Config) aws.Config
	// env sets more of Fleet's RUNFLEET_* variables (a stream's length).
	env map[string]string
	// streamURL is RUNFLEET_STREAM_URL: the stream on another origin, as
	// in AWS; empty: on the stack's own address.
	streamURL string
	// clock is the stack's fake clock, shared with whatever else the test
	// runs on it (another stack, a fake provider); nil: a new one.
	clock *clock.Fake
	// tablePrefix names the DynamoDB tables: two stacks given the same
	// one are two Fleet processes on one fleet's tables; empty: tables of
	// the stack's own.
	tablePrefix string
	// brokerHTTP is the client Fleet's broker calls the providers with
	// (fleetapp.Deps.BrokerHTTP): one trusting the fake providers' CAs;
	// nil: the broker's default.
	brokerHTTP *http.Client
	// broker mints Fleet's brokered keys (fleetapp.Deps.Broker); nil:
	// RUNFLEET_BROKER's, if env sets it.
	broker fleet.Broker
	// metrics receives Fleet's EMF metric lines; nil: none.
	metrics io.Writer
	// waker is what Fleet wakes through (fleetapp.Deps.Waker: a
	// wake.Local, as the local stack's); nil: RUNFLEET_WAKE_QUEUE's, if
	// env sets it.
	waker fleet.Waker
}

func newStack(t testing.TB, kind string, opts stackOptions) *stack {
	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials.json")
	credMap := map[string]string{hostCredRef: hostToken}
	for ref, secret := range opts.hostCredentials {
		credMap[ref] = secret
	}
	credJSON, _ := json.Marshal(credMap)
	if err := os.WriteFile(creds, credJSON, 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		config.EnvAdminToken:  adminToken,
		config.EnvCredentials: "file:" + creds,
	}
	for k, v := range opts.env {
		env[k] = v
	}
	if opts.hostTimeout > 0 {
		env[config.EnvHostTimeout] = opts.hostTimeout.String()
	}
	if opts.repoURLs != nil {
		b, _ := json.Marshal(opts.repoURLs)
		p := filepath.Join(dir, "repos.json")
		os.WriteFile(p, b, 0o600)
		env[config.EnvRepoURLs] = "file:" + p
	}
	if opts.streamURL != "" {
		env[config.EnvStreamURL] = opts.streamURL
	}
	switch kind {
	case "bolt":
		env[config.EnvStore] = "bolt:" + filepath.Join(dir, "fleet.db")
	case "dynamodb":
		prefix := opts.tablePrefix
		if prefix == "" {
			prefix = motoserver.Unique("t") + "-"
		}
		env[config.EnvStore] = "dynamodb"
		env[config.EnvDynamoDBEndpoint] = moto.URL
		n := dynamostore.Prefixed(prefix)
		env[config.EnvTableHosts], env[config.EnvTableRuns], env[config.EnvTableEvents] = n.Hosts, n.Runs, n.Events
		env[config.EnvTableEgress], env[config.EnvTableCallers], env[config.EnvTableIdempotency] = n.Egress, n.Callers, n.Idempotency
	default:
		t.Fatalf("unknown store %q", kind)
	}
	cfg, err := config.FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	var clk *clock.Fake
	var fleetClock clock.Clock = clock.Real{}
	if !opts.realClock {
		clk = opts.clock
		if clk == nil {
			clk = clock.NewFake(time.Now().UTC().Truncate(time.Second))
		}
		fleetClock = clk
	}
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	if opts.log != nil {
		log = slog.New(slog.NewJSONHandler(opts.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	parked := make(chan struct{})
	var streamParked func(ctx context.Context)
	if clk != nil {
		streamParked = func(ctx context.Context) {
			select {
			case parked <- struct{}{}:
			case <-ctx.Done():
			}
		}
	}
	app, err := fleetapp.New(context.Background(), cfg, fleetapp.Deps{
		Logger: log, Clock: fleetClock, CreateTables: true, Meter: opts.meter, DialContext: dialLoopbackOnly,
		OpenBolt: openBolt,
		LoadAWS: func(context.Context) (aws.Config, error) {
			if opts.aws != nil {
				return opts.aws(moto.AWSConfig()), nil
			}
			return moto.AWSConfig(), nil
		},
		StreamParked: streamParked, Broker: opts.broker, Metrics: opts.metrics, BrokerHTTP: opts.brokerHTTP,
		Waker: opts.waker,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Close() })
	handler, err := app.HTTPHandler(log, fleetClock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return &stack{app: app, srv: srv, clk: clk, meter: opts.meter, parked: parked}
}

// openBolt is the local stack's bolt opener (fleetapp.Deps.OpenBolt), for
// the stacks on bbolt.
func openBolt(path string, clk clock.Clock) (fleetapp.StoreCloser, error) {
	return boltstore.Open(path, boltstore.WithClock(clk))
}

// dialLoopbackOnly is Fleet's host dialer in tests: no test leaves
// loopback, so a host registered under a name (https://runner.example) is
// unreachable at once, without a DNS lookup, and a loopback address is
// dialled as usual.
func dialLoopbackOnly(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("tests: dialing %q: %w", addr, err)
	}
	if ip, err := netip.ParseAddr(host); err != nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("tests: dialing %s refused: tests never leave loopback (and never look a name up)", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// answer is one HTTP answer, its JSON body decoded.
type answer struct {
	status int
	raw    string
	body   map[string]any
}

func (a answer) str(key string) string {
	s, _ := a.body[key].(string)
	return s
}

// errorText is the error message of an error answer.
func (a answer) errorText() string { return a.str("error") }

// do sends a request with an optional bearer token and body.
func (s *stack) do(t testing.TB, method, path, token, body string, headers ...string) answer {
	t.Helper()
	a, err := s.send(method, path, token, body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// send is do for a goroutine other than the test's (which must not fail
// the test): a request that could not be sent is its error.
func (s *stack) send(method, path, token, body string, headers ...string) (answer, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.srv.URL+path, rd)
	if err != nil {
		return answer{}, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, raw: string(raw)}
	json.Unmarshal(raw, &a.body)
	return a, nil
}

// must sends a request and fails the test unless the status is want.
func (s *stack) must(t testing.TB, want int, method, path, token, body string, headers ...string) answer {
	t.Helper()
	a := s.do(t, method, path, token, body, headers...)
	if a.status != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, a.status, a.raw, want)
	}
	return a
}

// addHost starts a fake host on the stack's clock and registers it; extra
// JSON fields are merged into the registration.
func (s *stack) addHost(t testing.TB, id string, cfg fakehost.Config, extra map[string]any) *fakehost.Host {
	t.Helper()
	if s.clk != nil {
		// Not a nil *clock.Fake in the interface: a stack on the real
		// clock has real-clock hosts.
		cfg.Clock = s.clk
	}
	h := fakehost.New(cfg)
	t.Cleanup(h.Close)
	reg := map[string]any{"id": id, "baseUrl": h.URL, "credentialRef": hostCredRef}
	if cfg.TLS {
		reg["caPem"] = h.CAPEM()
	}
	for k, v := range extra {
		reg[k] = v
	}
	b, _ := json.Marshal(reg)
	s.must(t, http.StatusCreated, "POST", "/fleet/hosts", adminToken, string(b))
	return h
}

// aliceRun is the common start of a run's story: a fake host h1,
// registered and probed, a caller alice who may use everything, and one
// shell run of hers dispatched to it (Fleet's id and the host's).
func (s *stack) aliceRun(t testing.TB) (host *fakehost.Host, alice, id, child string) {
	t.Helper()
	host = s.addHost(t, "h1", fakehost.Config{}, nil)
	s.probe(t, "h1")
	alice = s.mint(t, "alice", "*", "*")
	a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
	return host, alice, a.str("fleetRunId"), a.str("childRunId")
}

func (s *stack) probe(t testing.TB, id string) answer {
	t.Helper()
	return s.must(t, http.StatusOK, "POST", "/fleet/hosts/"+id+"/probe", adminToken, "")
}

// mint creates a caller and returns its token.
func (s *stack) mint(t testing.TB, owner string, hosts, projects any) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"ownerId": owner, "allowedHosts": hosts, "allowedProjects": projects})
	a := s.must(t, http.StatusCreated, "POST", "/fleet/callers", adminToken, string(b))
	if a.str("ownerId") != owner || !strings.HasPrefix(a.str("token"), "rft_") {
		t.Fatalf("mint answer %s", a.raw)
	}
	return a.str("token")
}

func jsonBody(v any) string {
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(v)
	return buf.String()
}
