// Package fleetapp assembles Fleet from its configuration: the store
// (DynamoDB, or bbolt through Deps.OpenBolt), the credential source, the
// admin token, the broker of the keys Fleet mints, the queue wakes travel
// through (SQS, or the local stack's through Deps.Waker), the domain, and
// its five handlers (the API, the stream, the scheduled probe and sweep,
// the dispatcher). The Lambda functions and the local stack build Fleet
// only through it, so both run the same thing.
//
// No Lambda function links bbolt: the bolt store is opened by a function
// the local stack (and tests) pass in, never by this package.
package fleetapp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/runfleet/runfleet/shared/api"
	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/emf"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/lambdahttp"
	"github.com/runfleet/runfleet/shared/scheduled"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/shared/stream"
	"github.com/runfleet/runfleet/shared/wake"
)

// Deps are what the environment does not say.
type Deps struct {
	// Logger is required.
	Logger *slog.Logger
	// Clock: nil is the wall clock.
	Clock clock.Clock
	// Random: nil is crypto/rand.
	Random io.Reader
	// DialContext dials hosts: nil is a net.Dialer.
	DialContext hostproto.DialContextFunc
	// DefaultStore applies when RUNFLEET_STORE is unset: "dynamodb" in
	// Lambda, "bolt:<path>" in the local stack. Empty means "dynamodb".
	DefaultStore string
	// OpenBolt opens the bbolt store at path (RUNFLEET_STORE=bolt:<path>),
	// reading the time from clk; Close closes what it opened. The local
	// stack and tests set it (boltstore.Open); the Lambda functions leave
	// it nil, so that none links bbolt. Nil: a bolt store fails the start,
	// naming RUNFLEET_STORE.
	OpenBolt func(path string, clk clock.Clock) (StoreCloser, error)
	// CreateTables creates missing DynamoDB tables at start: for stacks
	// that own their tables (moto, DynamoDB Local); never in AWS, where
	// template.yaml owns them.
	CreateTables bool
	// LoadAWS loads the AWS configuration when one is needed (DynamoDB,
	// Secrets Manager); nil uses the SDK's default chain.
	LoadAWS func(ctx context.Context) (aws.Config, error)
	// Meter, when set, prices a DynamoDB store's calls (benchmarks only).
	Meter *dynamostore.Meter
	// Metrics receives Fleet's CloudWatch EMF metric lines (the scheduled
	// jobs' and the broker's, through one emf.Writer): stdout in Lambda;
	// nil: none.
	Metrics io.Writer
	// StreamParked is the Parked hook of the stream and of the events
	// route's long-poll (stream.Config, api.Config), for tests that drive
	// a fake clock; nil: none.
	StreamParked func(ctx context.Context)
	// Broker, when set, is the broker Fleet mints brokered keys with, in
	// place of the one RUNFLEET_BROKER configures (tests inject their
	// own); nil: RUNFLEET_BROKER's, or none.
	Broker fleet.Broker
	// BrokerHTTP is the client the broker calls the providers (GitHub,
	// token endpoints) with; nil: the broker's default. Tests trust their
	// fake providers' CA through it.
	BrokerHTTP *http.Client
	// Scheduled says the process authenticates no caller (the scheduled
	// probe and sweep, and the dispatcher, which its queue invokes): the
	// admin token is neither read nor missed. False (the api, the stream,
	// the local stack): it is read, and its absence is logged.
	Scheduled bool
	// Waker, when set, is what Fleet wakes through in place of the SQS
	// queue RUNFLEET_WAKE_QUEUE names: the local stack's in-process queue
	// (wake.Local, which it then runs with App.Dispatcher), or a test's.
	// Nil: RUNFLEET_WAKE_QUEUE's queue, or none when that is empty.
	Waker fleet.Waker
}

// StoreCloser is a store that holds something until it is closed: the
// bbolt file, and its lock.
type StoreCloser interface {
	store.Store
	io.Closer
}

// App is an assembled Fleet.
type App struct {
	Config      config.Fleet
	Store       store.Store
	Credentials credentials.Source
	Fleet       *fleet.Fleet
	API         *api.Handler
	// Stream serves GET /fleet/runs/{id}/stream (the stream function).
	Stream *stream.Handler
	// Jobs are the scheduled probe and sweep (the probe and sweep functions).
	Jobs *scheduled.Jobs
	// Dispatcher fills hosts from the wake queue's messages (the
	// dispatcher function; the local stack's in-process queue).
	Dispatcher *wake.Dispatcher
	// Waker is what Fleet wakes through: Deps.Waker, the SQS queue of
	// RUNFLEET_WAKE_QUEUE, or nil (no wakes: waiting runs start only from
	// the probe pass's own fill).
	Waker fleet.Waker
	// AdminConfigured reports whether a bootstrap admin token is in use.
	AdminConfigured bool

	closers []func() error
}

// New builds Fleet from cfg (config.FromEnv) and deps: the store, the
// credential source and the admin token, then the domain and its
// handlers. What it opened is closed again when a later step fails.
func New(ctx context.Context, cfg config.Fleet, deps Deps) (*App, error) {
	if deps.Logger == nil {
		return nil, errors.New("fleetapp: Deps.Logger is required")
	}
	cfg.Store = storeSetting(cfg.Store, deps.DefaultStore)
	kind, boltPath, err := config.ParseStore(cfg.Store)
	if err != nil {
		return nil, err
	}
	app := &App{Config: cfg}
	ok := false
	defer func() {
		if !ok {
			app.Close()
		}
	}()
	clients := &awsClients{ctx: ctx, load: deps.LoadAWS}

	if err := app.openStore(ctx, kind, boltPath, deps, clients); err != nil {
		return nil, err
	}
	credOpts := credentials.Options{Clock: deps.Clock}
	if cfg.Credentials.NeedsAWS() {
		if credOpts.SecretsManager, err = clients.secretsManager(); err != nil {
			return nil, err
		}
	}
	if app.Credentials, err = cfg.Credentials.Open(credOpts); err != nil {
		return nil, err
	}
	plan := planAdminToken(cfg, deps.Scheduled)
	if plan.warning != "" {
		deps.Logger.Warn(plan.warning)
	}
	admin, err := openAdminToken(ctx, plan.source, cfg, deps.Clock, clients)
	if err != nil {
		return nil, err
	}
	app.AdminConfigured = plan.source != adminNone
	if err := app.assemble(ctx, cfg, deps, clients, admin); err != nil {
		return nil, err
	}
	ok = true
	return app, nil
}

// storeSetting is the RUNFLEET_STORE in effect: the configured one, else
// the process's default, else DynamoDB.
func storeSetting(configured, processDefault string) string {
	switch {
	case configured != "":
		return configured
	case processDefault != "":
		return processDefault
	}
	return config.StoreDynamoDB
}

// awsClients loads the AWS configuration, and the Secrets Manager client,
// once and only when a part of Fleet needs them: a bolt store with file
// credentials and a literal admin token needs no AWS at all. It lives for
// one call of New, whose ctx it holds.
type awsClients struct {
	ctx  context.Context
	load func(ctx context.Context) (aws.Config, error) // nil: the SDK's default chain
	cfg  *aws.Config
	sm   *secretsmanager.Client
}

func (c *awsClients) config() (aws.Config, error) {
	if c.cfg != nil {
		return *c.cfg, nil
	}
	load := c.load
	if load == nil {
		load = func(ctx context.Context) (aws.Config, error) { return awsconfig.LoadDefaultConfig(ctx) }
	}
	ac, err := load(c.ctx)
	if err != nil {
		return aws.Config{}, fmt.Errorf("fleetapp: loading the AWS configuration: %w", err)
	}
	c.cfg = &ac
	return ac, nil
}

func (c *awsClients) secretsManager() (*secretsmanager.Client, error) {
	if c.sm == nil {
		ac, err := c.config()
		if err != nil {
			return nil, err
		}
		c.sm = secretsmanager.NewFromConfig(ac)
	}
	return c.sm, nil
}

// openStore opens the store kind names: the bolt file through
// deps.OpenBolt (closed by Close), or DynamoDB's tables (created first when
// deps says the stack owns them).
func (a *App) openStore(ctx context.Context, kind, boltPath string, deps Deps, clients *awsClients) error {
	switch kind {
	case config.StoreBolt:
		if deps.OpenBolt == nil {
			return fmt.Errorf("fleetapp: %s=%q: this process opens no bolt store (only the local stack links one): set %s=%s",
				config.EnvStore, a.Config.Store, config.EnvStore, config.StoreDynamoDB)
		}
		st, err := deps.OpenBolt(boltPath, orReal(deps.Clock))
		if err != nil {
			return err
		}
		a.Store = st
		a.closers = append(a.closers, st.Close)
	case config.StoreDynamoDB:
		ac, err := clients.config()
		if err != nil {
			return err
		}
		client := dynamodb.NewFromConfig(ac, func(o *dynamodb.Options) {
			if a.Config.DynamoDBEndpoint != "" {
				o.BaseEndpoint = aws.String(a.Config.DynamoDBEndpoint)
			}
		})
		st, err := dynamostore.New(client, dynamostore.Config{
			Tables: a.Config.Tables, Clock: deps.Clock, Meter: deps.Meter,
		})
		if err != nil {
			return err
		}
		if deps.CreateTables {
			if err := st.CreateTables(ctx); err != nil {
				return err
			}
		}
		a.Store = st
	}
	return nil
}

// adminSource is where the bootstrap admin token comes from.
type adminSource int

const (
	adminNone           adminSource = iota // no admin token: nobody administers Fleet
	adminLiteral                           // RUNFLEET_ADMIN_TOKEN
	adminSecretsManager                    // RUNFLEET_ADMIN_TOKEN_SECRET, re-read every TTL
)

// adminPlan is planAdminToken's decision: the source, and a warning to log
// when a process that authenticates callers has none.
type adminPlan struct {
	source  adminSource
	warning string
}

// planAdminToken decides where the admin token comes from. The scheduled
// jobs authenticate no caller: they neither read a token nor miss one. A
// literal token wins over a secret.
func planAdminToken(cfg config.Fleet, scheduled bool) adminPlan {
	switch {
	case scheduled:
		return adminPlan{source: adminNone}
	case cfg.AdminToken != "":
		return adminPlan{source: adminLiteral}
	case cfg.AdminTokenSecret != "":
		return adminPlan{source: adminSecretsManager}
	}
	return adminPlan{source: adminNone,
		warning: "no admin token: set RUNFLEET_ADMIN_TOKEN or RUNFLEET_ADMIN_TOKEN_SECRET to administer Fleet"}
}

// openAdminToken opens source. A secret is read once now, so a missing or
// short secret fails the cold start rather than the first admin request.
func openAdminToken(ctx context.Context, source adminSource, cfg config.Fleet, clk clock.Clock, clients *awsClients) (auth.AdminTokenSource, error) {
	switch source {
	case adminLiteral:
		return auth.StaticAdminToken(cfg.AdminToken), nil
	case adminSecretsManager:
		sm, err := clients.secretsManager()
		if err != nil {
			return nil, err
		}
		secret := newAdminSecret(sm, cfg.AdminTokenSecret, clk, cfg.AdminTokenTTL)
		if _, err := secret.AdminToken(ctx); err != nil {
			return nil, err
		}
		return secret, nil
	}
	return auth.StaticAdminToken(""), nil
}

// assemble builds the domain on the opened store and credentials, with the
// broker, and its handlers: the API, the stream and the scheduled jobs.
func (a *App) assemble(ctx context.Context, cfg config.Fleet, deps Deps, clients *awsClients, admin auth.AdminTokenSource) error {
	repos, err := fleet.LoadRepoURLs(cfg.RepoURLsPath())
	if err != nil {
		return err
	}
	metrics := emf.New(deps.Metrics)
	b, err := a.openBroker(ctx, cfg, deps, clients, metrics)
	if err != nil {
		return err
	}
	if a.Waker, err = openWaker(cfg, deps, clients); err != nil {
		return err
	}
	a.Fleet, err = fleet.New(fleet.Config{
		Store: a.Store, Credentials: a.Credentials, Logger: deps.Logger, Clock: deps.Clock,
		Random: deps.Random, DialContext: deps.DialContext, HostTimeout: cfg.HostTimeout,
		ProbeTimeout: cfg.ProbeTimeout, ProbeMaxAge: cfg.ProbeMaxAge, ProbeConcurrency: cfg.ProbeConcurrency,
		Retention: cfg.Retention(), RepoURLs: repos, Broker: b, Metrics: metrics,
		Waker: a.Waker, QueueDefault: cfg.QueueTimeout, QueueMaxTimeout: cfg.QueueMaxTimeout,
		ProbeRefresh: cfg.ProbeRefresh, CapacityClasses: cfg.CapacityClasses,
	})
	if err != nil {
		return err
	}
	if a.Dispatcher, err = wake.NewDispatcher(wake.DispatcherConfig{Fleet: a.Fleet, Logger: deps.Logger, Clock: deps.Clock}); err != nil {
		return err
	}
	authn := auth.NewAuthenticatorWithSource(a.Store, admin)
	a.API, err = api.New(api.Config{Fleet: a.Fleet, Auth: authn, Logger: deps.Logger, Clock: deps.Clock, StreamURL: cfg.StreamURL,
		Parked: deps.StreamParked})
	if err != nil {
		return err
	}
	a.Stream, err = stream.New(stream.Config{
		Fleet: a.Fleet, Auth: authn, Logger: deps.Logger, Clock: deps.Clock,
		PollInterval: cfg.StreamPollInterval, KeepAlive: cfg.StreamKeepAlive, MaxDuration: cfg.StreamMaxDuration,
		IdleTimeout: cfg.StreamIdleTimeout, Leases: a.Store, MaxPerCaller: cfg.StreamMaxPerCaller,
		Random: deps.Random, Parked: deps.StreamParked,
	})
	if err != nil {
		return err
	}
	a.Jobs, err = scheduled.New(scheduled.Config{Fleet: a.Fleet, Logger: deps.Logger, Clock: deps.Clock, Metrics: metrics})
	return err
}

// openWaker is what Fleet wakes through: deps.Waker when the process
// brings its own, else the SQS queue RUNFLEET_WAKE_QUEUE names (AWS loaded
// only then), else none.
func openWaker(cfg config.Fleet, deps Deps, clients *awsClients) (fleet.Waker, error) {
	if deps.Waker != nil {
		return deps.Waker, nil
	}
	if cfg.WakeQueue == "" {
		return nil, nil
	}
	ac, err := clients.config()
	if err != nil {
		return nil, err
	}
	return wake.NewSQS(sqs.NewFromConfig(ac), cfg.WakeQueue)
}

// Function is one of Fleet's Lambda functions, for StartFunction.
type Function struct {
	// Name prefixes the function's start errors ("api", "sweep", ...).
	Name string
	// Scheduled: a function no caller calls, the probe, the sweep or the
	// dispatcher (see Deps.Scheduled).
	Scheduled bool
}

// StartFunction is a Lambda function's cold start: its configuration read
// through getenv (os.Getenv in main), Fleet assembled on DynamoDB (the
// default in Lambda) with JSON logs on w at the configured level and the
// scheduled jobs' EMF metric lines on w too. A function's main is this,
// then lambda.Start with its handler.
func StartFunction(getenv func(string) string, w io.Writer, fn Function) (*App, error) {
	cfg, err := config.FromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("%s: configuration: %w", fn.Name, err)
	}
	log := NewLogger(w, cfg.LogLevel)
	app, err := New(context.Background(), cfg, Deps{Logger: log, Metrics: w, DefaultStore: config.StoreDynamoDB, Scheduled: fn.Scheduled})
	if err != nil {
		log.Error(fn.Name+": start", logErr, err.Error())
		return nil, fmt.Errorf("%s: start: %w", fn.Name, err)
	}
	return app, nil
}

// logErr is the log field of an error.
const logErr = "err"

// HTTPHandler is Fleet's HTTP surface on one address, as the local stack
// (and tests) serve it: the stream's path to the stream handler, every
// other request to the api handler through the API Gateway v2 adapter.
func (a *App) HTTPHandler(log *slog.Logger, clk clock.Clock) (http.Handler, error) {
	adapter, err := lambdahttp.New(lambdahttp.Config{Handler: a.API.Handle, Logger: log, Clock: clk})
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := stream.Path(r.URL.EscapedPath()); ok {
			a.Stream.ServeHTTP(w, r)
			return
		}
		adapter.ServeHTTP(w, r)
	}), nil
}

// adminSecret is the admin token kept in Secrets Manager, read through the
// credentials package's Secrets Manager source: its cache is the TTL after
// which a warm process re-reads the secret, so a rotated token stops
// working within it. A read that fails (the secret gone, Secrets Manager
// unreachable) is not answered with the old value: the admin is refused
// (as a fault) until a read succeeds.
type adminSecret struct {
	src credentials.Source
	id  string
	ref string
}

// newAdminSecret reads the secret id (a name or an ARN) through a source of
// its own, with ttl. The source takes a prefix and a ref: the id is split
// after its last ':' (an ARN's "...:secret:" is the prefix) so the ref has
// a ref's shape.
func newAdminSecret(sm credentials.SecretsManagerAPI, id string, clk clock.Clock, ttl time.Duration) adminSecret {
	cut := strings.LastIndex(id, ":") + 1
	return adminSecret{src: credentials.NewSecretsManager(sm, id[:cut], clk, ttl), id: id, ref: id[cut:]}
}

// AdminToken returns the secret's SecretString as it stood at most ttl ago.
func (a adminSecret) AdminToken(ctx context.Context) (string, error) {
	tok, err := a.src.Secret(ctx, a.ref)
	if err != nil {
		return "", fmt.Errorf("fleetapp: reading the admin token secret %s: %w", a.id, err)
	}
	if len(tok) < config.MinAdminTokenLength {
		return "", fmt.Errorf("fleetapp: the admin token secret %s holds fewer than %d characters", a.id, config.MinAdminTokenLength)
	}
	return tok, nil
}

func orReal(c clock.Clock) clock.Clock {
	if c == nil {
		return clock.Real{}
	}
	return c
}

// Close releases the store.
func (a *App) Close() error {
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		errs = append(errs, a.closers[i]())
	}
	a.closers = nil
	return errors.Join(errs...)
}

// NewLogger is Fleet's production logger: JSON lines on w at level.
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
