// Package config owns Fleet's environment: every RUNFLEET_* variable the
// Fleet functions and the local stack read, parsed into one Fleet struct
// with clear errors. main packages read the environment; libraries take the
// parsed values.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/shared/stream"
)

// Environment variable names.
const (
	EnvAdminToken       = "RUNFLEET_ADMIN_TOKEN"
	EnvAdminTokenSecret = "RUNFLEET_ADMIN_TOKEN_SECRET"
	EnvAdminTokenTTL    = "RUNFLEET_ADMIN_TOKEN_TTL"
	EnvStore            = "RUNFLEET_STORE"
	EnvDynamoDBEndpoint = "RUNFLEET_DYNAMODB_ENDPOINT"
	EnvTableHosts       = "RUNFLEET_TABLE_HOSTS"
	EnvTableRuns        = "RUNFLEET_TABLE_RUNS"
	EnvTableEvents      = "RUNFLEET_TABLE_EVENTS"
	EnvTableEgress      = "RUNFLEET_TABLE_EGRESS"
	EnvTableCallers     = "RUNFLEET_TABLE_CALLERS"
	EnvTableIdempotency = "RUNFLEET_TABLE_IDEMPOTENCY"
	EnvCredentials      = "RUNFLEET_CREDENTIALS"
	// EnvBroker names the broker's recipes (the keys Fleet mints) and
	// EnvBrokerKey what seals the tokens it keeps (README, "Credentials
	// Fleet mints").
	EnvBroker           = "RUNFLEET_BROKER"
	EnvBrokerKey        = "RUNFLEET_BROKER_KEY"
	EnvRepoURLs         = "RUNFLEET_REPO_URLS"
	EnvRetentionDays    = "RUNFLEET_RETENTION_DAYS"
	EnvAddr             = "RUNFLEET_ADDR"
	EnvHostTimeout      = "RUNFLEET_HOST_TIMEOUT"
	EnvProbeTimeout     = "RUNFLEET_PROBE_TIMEOUT"
	EnvProbeMaxAge      = "RUNFLEET_PROBE_MAX_AGE"
	EnvProbeConcurrency = "RUNFLEET_PROBE_CONCURRENCY"
	EnvLogLevel         = "RUNFLEET_LOG_LEVEL"
	// The stream's timing (the stream function and the local stack).
	EnvStreamPollInterval = "RUNFLEET_STREAM_POLL_INTERVAL"
	EnvStreamKeepAlive    = "RUNFLEET_STREAM_KEEPALIVE"
	EnvStreamMaxDuration  = "RUNFLEET_STREAM_MAX_DURATION"
	// EnvStreamIdleTimeout ends a stream whose run has been silent that
	// long (with a resume hint).
	EnvStreamIdleTimeout = "RUNFLEET_STREAM_IDLE_TIMEOUT"
	// EnvStreamMaxPerCaller caps each caller's open streams, across every
	// instance of the stream function (1 to 100).
	EnvStreamMaxPerCaller = "RUNFLEET_STREAM_MAX_PER_CALLER"
	// EnvStreamURL is the stream's public base URL, for the links the API
	// gives (in AWS the stream function's URL; template.yaml sets it).
	EnvStreamURL = "RUNFLEET_STREAM_URL"
	// The local stack's timers for the scheduled jobs (in AWS, EventBridge
	// Scheduler runs them).
	EnvProbeInterval = "RUNFLEET_PROBE_INTERVAL"
	EnvSweepInterval = "RUNFLEET_SWEEP_INTERVAL"
	// Runs that wait (README, "Runs that wait"): the wait of a dispatch
	// that does not say, and the longest any may ask.
	EnvQueueTimeout    = "RUNFLEET_QUEUE_TIMEOUT"
	EnvQueueMaxTimeout = "RUNFLEET_QUEUE_MAX_TIMEOUT"
	// EnvWakeQueue is the SQS queue wakes travel through (in AWS the
	// DispatchWakes queue's URL; template.yaml sets it). Empty: no queue
	// (the local stack wakes in its own process).
	EnvWakeQueue = "RUNFLEET_WAKE_QUEUE"
	// EnvProbeRefresh is the longest a host's recorded probe goes
	// unwritten while nothing material changes.
	EnvProbeRefresh = "RUNFLEET_PROBE_REFRESH"
	// EnvCapacityClasses are routing classes the capacity figures always
	// report, comma-separated (fleet.ClassOf's form).
	EnvCapacityClasses = "RUNFLEET_CAPACITY_CLASSES"
)

// Defaults of this package's own settings. The others are their
// component's (fleet.Default*, stream.Default*, dynamostore's table
// names), filled in here so the parsed configuration shows what runs.
const (
	DefaultAddr          = "127.0.0.1:8080"
	DefaultProbeInterval = 10 * time.Second
	DefaultSweepInterval = 10 * time.Second
	// MinAdminTokenLength refuses a guessable bootstrap token.
	MinAdminTokenLength = 16
	// DefaultAdminTokenTTL bounds how long a warm process keeps accepting
	// an admin token after its secret was rotated: a minute is a short
	// window for a leaked token and one Secrets Manager read per minute
	// per warm container (43,200 a month: about $0.22 at $0.05 per 10,000).
	DefaultAdminTokenTTL = time.Minute
)

// DefaultRetentionDays is fleet.DefaultRetention in days.
const DefaultRetentionDays = int(fleet.DefaultRetention / (24 * time.Hour))

// Tables names Fleet's DynamoDB tables; an empty name is
// dynamostore.DefaultTableNames()'s (the local stack on DynamoDB Local or
// moto; template.yaml always sets them).
type Tables = dynamostore.TableNames

// Fleet is Fleet's configuration.
type Fleet struct {
	// AdminToken bootstraps the admin caller (ownerId "admin"). Empty: use
	// AdminTokenSecret; both empty: no admin token (only minted callers).
	AdminToken string
	// AdminTokenSecret is a Secrets Manager id holding the admin token (in
	// AWS); ignored when AdminToken is set.
	AdminTokenSecret string
	// AdminTokenTTL is how long a value read from AdminTokenSecret is
	// reused: a rotated admin token stops working within it. Zero means
	// one minute.
	AdminTokenTTL time.Duration
	// Store is "dynamodb" or "bolt:<path>"; empty means the runtime's
	// default (dynamodb in Lambda, bolt in the local stack).
	Store string
	// DynamoDBEndpoint overrides the DynamoDB endpoint; empty is AWS's.
	DynamoDBEndpoint string
	// Tables are the DynamoDB table names; each empty one is defaulted.
	Tables Tables
	// Credentials is RUNFLEET_CREDENTIALS, parsed.
	Credentials credentials.Spec
	// Broker is RUNFLEET_BROKER: the broker's recipes, `file:<path>` or a
	// Secrets Manager secret id or ARN holding them. Empty: no key is
	// brokered (every key keeps its host's value).
	Broker string
	// BrokerKey is RUNFLEET_BROKER_KEY: what seals the tokens the broker
	// keeps, `kms:<key id|arn|alias>` or `file:<path>` (32 random bytes).
	// Required when Broker has a recipe (checked when it is read, at
	// start); empty otherwise.
	BrokerKey string
	// RepoURLs is RUNFLEET_REPO_URLS: "file:<path>" or empty (no map).
	RepoURLs string
	// RetentionDays keeps ended runs and their events; zero means 30.
	RetentionDays int
	// Addr is the local stack's listen address; empty means 127.0.0.1:8080.
	Addr string
	// HostTimeout bounds a call to a host, and so sets a dispatch's
	// deadline; zero means 10s.
	HostTimeout time.Duration
	// ProbeTimeout bounds one probe; zero means 5s.
	ProbeTimeout time.Duration
	// ProbeMaxAge is how old a probe may be before routing calls it
	// stale_probe; zero means 30m.
	ProbeMaxAge time.Duration
	// ProbeRefresh is the longest a host's recorded probe goes unwritten
	// while nothing material changes; zero means ProbeMaxAge/2. Under
	// ProbeMaxAge, or a quiet host would go stale between its writes.
	ProbeRefresh time.Duration
	// ProbeConcurrency bounds how many hosts are probed at once; zero means 8.
	ProbeConcurrency int
	// LogLevel is the slog level; zero is info.
	LogLevel slog.Level
	// StreamPollInterval is the stream's time between polls; zero means 1s.
	StreamPollInterval time.Duration
	// StreamKeepAlive is the silence after which the stream sends a
	// keep-alive comment; zero means 15s.
	StreamKeepAlive time.Duration
	// StreamMaxDuration bounds a stream (it ends with a retry hint); zero
	// means 14m. In Lambda the invocation's deadline bounds it too.
	StreamMaxDuration time.Duration
	// StreamIdleTimeout ends a stream after this long without a new event;
	// zero means 3m.
	StreamIdleTimeout time.Duration
	// StreamMaxPerCaller caps a caller's open streams (429 beyond); zero
	// means 10, at most store.MaxStreamSlots (100).
	StreamMaxPerCaller int
	// StreamURL is the stream's public base URL, for the links of a run
	// the API answers; empty means the API's own base (the local stack
	// serves both on one address).
	StreamURL string
	// ProbeInterval and SweepInterval are the local stack's timers for the
	// scheduled probe and sweep; zero means 10s each.
	ProbeInterval, SweepInterval time.Duration
	// QueueTimeout is how long a dispatch that does not say may wait for
	// capacity; zero: such a dispatch never waits (today's answers).
	QueueTimeout time.Duration
	// QueueMaxTimeout bounds any dispatch's wait; zero means 24h. At least
	// QueueTimeout.
	QueueMaxTimeout time.Duration
	// WakeQueue is the URL of the SQS queue wakes are sent to; empty:
	// none (the local stack's in-process queue, or no wakes at all).
	WakeQueue string
	// CapacityClasses are routing classes the capacity figures report even
	// with nothing queued, each in fleet.ClassOf's form (normalised when
	// read: labels sorted and escaped); nil: none.
	CapacityClasses []string
}

// FromEnv reads every variable through getenv (os.Getenv in main), fills
// defaults and validates. Errors name the variable.
func FromEnv(getenv func(string) string) (Fleet, error) {
	var c Fleet
	var errs []error
	c.AdminToken = getenv(EnvAdminToken)
	c.AdminTokenSecret = getenv(EnvAdminTokenSecret)
	c.Store = getenv(EnvStore)
	c.DynamoDBEndpoint = getenv(EnvDynamoDBEndpoint)
	c.Tables = Tables{
		Hosts:       getenv(EnvTableHosts),
		Runs:        getenv(EnvTableRuns),
		Events:      getenv(EnvTableEvents),
		Egress:      getenv(EnvTableEgress),
		Callers:     getenv(EnvTableCallers),
		Idempotency: getenv(EnvTableIdempotency),
	}
	spec, err := credentials.ParseSpec(getenv(EnvCredentials))
	if err != nil {
		// Its kinds are a set: said as every enumerated variable says it.
		err = notOneOf(EnvCredentials, getenv(EnvCredentials), "file:<path>", "secretsmanager:<prefix>")
	}
	errs = append(errs, err)
	c.Credentials = spec
	c.RepoURLs = getenv(EnvRepoURLs)
	c.Broker = getenv(EnvBroker)
	c.BrokerKey = getenv(EnvBrokerKey)
	c.StreamURL = getenv(EnvStreamURL)
	c.Addr = getenv(EnvAddr)
	c.RetentionDays, err = positiveInt(getenv, EnvRetentionDays)
	errs = append(errs, err)
	c.ProbeConcurrency, err = positiveInt(getenv, EnvProbeConcurrency)
	errs = append(errs, err)
	c.StreamMaxPerCaller, err = positiveInt(getenv, EnvStreamMaxPerCaller)
	errs = append(errs, err)
	c.HostTimeout, err = positiveDuration(getenv, EnvHostTimeout)
	errs = append(errs, err)
	c.ProbeTimeout, err = positiveDuration(getenv, EnvProbeTimeout)
	errs = append(errs, err)
	c.ProbeMaxAge, err = positiveDuration(getenv, EnvProbeMaxAge)
	errs = append(errs, err)
	c.ProbeRefresh, err = positiveDuration(getenv, EnvProbeRefresh)
	errs = append(errs, err)
	// "0s" says outright what unset says: no dispatch waits unless it asks.
	c.QueueTimeout, err = nonNegativeDuration(getenv, EnvQueueTimeout)
	errs = append(errs, err)
	c.QueueMaxTimeout, err = positiveDuration(getenv, EnvQueueMaxTimeout)
	errs = append(errs, err)
	c.WakeQueue = getenv(EnvWakeQueue)
	c.CapacityClasses, err = parseClasses(getenv(EnvCapacityClasses))
	errs = append(errs, err)
	for _, d := range []struct {
		dst  *time.Duration
		name string
	}{
		{&c.StreamPollInterval, EnvStreamPollInterval}, {&c.StreamKeepAlive, EnvStreamKeepAlive},
		{&c.StreamMaxDuration, EnvStreamMaxDuration}, {&c.StreamIdleTimeout, EnvStreamIdleTimeout},
		{&c.ProbeInterval, EnvProbeInterval},
		{&c.SweepInterval, EnvSweepInterval}, {&c.AdminTokenTTL, EnvAdminTokenTTL},
	} {
		*d.dst, err = positiveDuration(getenv, d.name)
		errs = append(errs, err)
	}
	level, err := Enum(getenv, EnvLogLevel, LogLevels...)
	errs = append(errs, err)
	if level != "" {
		// slog parses more than the four names ("WARN+2", "Debug"): the
		// set above is what is accepted, this only converts it.
		errs = append(errs, c.LogLevel.UnmarshalText([]byte(level)))
	}
	if err := errors.Join(errs...); err != nil {
		return Fleet{}, err
	}
	c.fillDefaults()
	if err := c.Validate(); err != nil {
		return Fleet{}, err
	}
	return c, nil
}

func (c *Fleet) fillDefaults() {
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	tables := dynamostore.DefaultTableNames()
	def(&c.Tables.Hosts, tables.Hosts)
	def(&c.Tables.Runs, tables.Runs)
	def(&c.Tables.Events, tables.Events)
	def(&c.Tables.Egress, tables.Egress)
	def(&c.Tables.Callers, tables.Callers)
	def(&c.Tables.Idempotency, tables.Idempotency)
	def(&c.Addr, DefaultAddr)
	if c.RetentionDays == 0 {
		c.RetentionDays = DefaultRetentionDays
	}
	if c.ProbeConcurrency == 0 {
		c.ProbeConcurrency = fleet.DefaultProbeConcurrency
	}
	if c.StreamMaxPerCaller == 0 {
		c.StreamMaxPerCaller = stream.DefaultMaxPerCaller
	}
	for _, d := range []struct {
		dst *time.Duration
		def time.Duration
	}{
		{&c.HostTimeout, fleet.DefaultHostTimeout}, {&c.ProbeTimeout, fleet.DefaultProbeTimeout},
		{&c.ProbeMaxAge, fleet.DefaultProbeMaxAge},
		{&c.StreamPollInterval, stream.DefaultPollInterval}, {&c.StreamKeepAlive, stream.DefaultKeepAlive},
		{&c.StreamMaxDuration, stream.DefaultMaxDuration}, {&c.StreamIdleTimeout, stream.DefaultIdleTimeout},
		{&c.ProbeInterval, DefaultProbeInterval},
		{&c.SweepInterval, DefaultSweepInterval}, {&c.AdminTokenTTL, DefaultAdminTokenTTL},
		{&c.QueueMaxTimeout, fleet.DefaultQueueMaxTimeout},
	} {
		if *d.dst == 0 {
			*d.dst = d.def
		}
	}
	// After ProbeMaxAge's own default: the refresh follows the age in
	// effect.
	if c.ProbeRefresh == 0 {
		c.ProbeRefresh = c.ProbeMaxAge / 2
	}
}

// Validate checks values that parse but make no sense.
func (c Fleet) Validate() error {
	var errs []error
	if c.AdminToken != "" && len(c.AdminToken) < MinAdminTokenLength {
		errs = append(errs, fmt.Errorf("%s is shorter than %d characters", EnvAdminToken, MinAdminTokenLength))
	}
	if c.Store != "" {
		if _, _, err := ParseStore(c.Store); err != nil {
			errs = append(errs, err)
		}
	}
	if c.StreamURL != "" {
		if err := fleetapi.CheckBaseURL(c.StreamURL); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvStreamURL, err))
		}
	}
	if c.ProbeRefresh >= c.ProbeMaxAge {
		// Both named: either may be the one to change, and an unset
		// PROBE_MAX_AGE is its default, which the operator may not know.
		errs = append(errs, fmt.Errorf("%s=%s is not under %s=%s: a quiet host's probe would go stale before it is written again",
			EnvProbeRefresh, c.ProbeRefresh, EnvProbeMaxAge, c.ProbeMaxAge))
	}
	if c.QueueTimeout > c.QueueMaxTimeout {
		errs = append(errs, fmt.Errorf("%s=%s is over %s=%s: the default wait must be one a dispatch may ask",
			EnvQueueTimeout, c.QueueTimeout, EnvQueueMaxTimeout, c.QueueMaxTimeout))
	}
	if c.WakeQueue != "" {
		if u, err := url.Parse(c.WakeQueue); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || strings.Trim(u.Path, "/") == "" {
			errs = append(errs, fmt.Errorf("%s=%q: want the queue's URL, https://sqs.<region>.amazonaws.com/<account>/<name>", EnvWakeQueue, c.WakeQueue))
		}
	}
	if c.StreamMaxPerCaller > store.MaxStreamSlots {
		errs = append(errs, fmt.Errorf("%s=%d: want at most %d", EnvStreamMaxPerCaller, c.StreamMaxPerCaller, store.MaxStreamSlots))
	}
	if c.RepoURLs != "" && !strings.HasPrefix(c.RepoURLs, "file:") || c.RepoURLs == "file:" {
		errs = append(errs, notOneOf(EnvRepoURLs, c.RepoURLs, "file:<path>"))
	}
	if c.Broker != "" && broker.CheckRef(c.Broker) != nil {
		// Not quoted: a document pasted here in place of its id may hold
		// what it should only name.
		errs = append(errs, fmt.Errorf("%s: want file:<path> or a Secrets Manager secret id or ARN", EnvBroker))
	}
	if kind, arg, _ := strings.Cut(c.BrokerKey, ":"); c.BrokerKey != "" && (kind != "kms" && kind != "file" || arg == "") {
		// Not quoted: the key pasted here in place of where it is.
		errs = append(errs, fmt.Errorf("%s: want kms:<key id|arn|alias> or file:<path>", EnvBrokerKey))
	}
	return errors.Join(errs...)
}

// Store kinds.
const (
	StoreDynamoDB = "dynamodb"
	StoreBolt     = "bolt"
)

// ParseStore splits RUNFLEET_STORE into its kind and, for bolt, the path.
func ParseStore(s string) (kind, path string, err error) {
	if s == StoreDynamoDB {
		return StoreDynamoDB, "", nil
	}
	if p, ok := strings.CutPrefix(s, StoreBolt+":"); ok && p != "" {
		return StoreBolt, p, nil
	}
	return "", "", notOneOf(EnvStore, s, StoreDynamoDB, StoreBolt+":<path>")
}

// LogLevels are RUNFLEET_LOG_LEVEL's values (template.yaml's LogLevel
// parameter allows the same).
var LogLevels = []string{"debug", "info", "warn", "error"}

// Enum reads an enumerated variable through getenv: "" when it is unset or
// empty, else its value, which must be one of allowed exactly (case and
// spaces included). Any other value is an error naming the variable and
// every allowed value: a typo stops the start rather than passing as the
// default.
func Enum(getenv func(string) string, name string, allowed ...string) (string, error) {
	v := getenv(name)
	if v == "" || slices.Contains(allowed, v) {
		return v, nil
	}
	return "", notOneOf(name, v, allowed...)
}

// Switch reads an on/off variable through getenv: def when it is unset or
// empty, true for "on", false for "off", and an error for anything else
// ("of", "0", "false", "OFF"), so a misspelt switch never passes as its
// default.
func Switch(getenv func(string) string, name string, def bool) (bool, error) {
	switch v, err := Enum(getenv, name, "on", "off"); {
	case err != nil:
		return false, err
	case v == "":
		return def, nil
	default:
		return v == "on", nil
	}
}

// notOneOf is the error of an enumerated variable set to another value:
// `RUNFLEET_X: "of" is not one of on, off` (`is not file:<path>` for a set
// of one).
func notOneOf(name, value string, allowed ...string) error {
	if len(allowed) == 1 {
		return fmt.Errorf("%s: %q is not %s", name, value, allowed[0])
	}
	return fmt.Errorf("%s: %q is not one of %s", name, value, strings.Join(allowed, ", "))
}

// RepoURLsPath is the path of the repository map file, or "" for none.
func (c Fleet) RepoURLsPath() string { return strings.TrimPrefix(c.RepoURLs, "file:") }

// Retention is RetentionDays as a duration.
func (c Fleet) Retention() time.Duration { return time.Duration(c.RetentionDays) * 24 * time.Hour }

func positiveInt(getenv func(string) string, name string) (int, error) {
	v := getenv(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive integer", name, v)
	}
	return n, nil
}

func nonNegativeDuration(getenv func(string) string, name string) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s=%q: want a Go duration such as 10m (0s: none)", name, v)
	}
	return d, nil
}

// parseClasses reads RUNFLEET_CAPACITY_CLASSES: routing classes separated
// by commas, each an agent and optionally "?" and its labels as a query
// ("claude?pool=gpu"). Each is normalised to fleet.ClassOf's form, the
// one the capacity figures and the RoutingClass dimension name it by, so
// "claude?pool=gpu&arch=arm" and "claude?arch=arm&pool=gpu" are one class.
func parseClasses(v string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var out []string
	for _, raw := range strings.Split(v, ",") {
		c := strings.TrimSpace(raw)
		agent, labels, err := fleet.ParseClass(c)
		switch {
		case c == "":
			return nil, fmt.Errorf("%s=%q: an empty class (two commas, or one at an end)", EnvCapacityClasses, v)
		case err != nil:
			return nil, fmt.Errorf("%s: class %q: %v", EnvCapacityClasses, c, err)
		case agent == "":
			return nil, fmt.Errorf("%s: class %q names no agent: want <agent>[?<label>=<value>&...]", EnvCapacityClasses, c)
		}
		if c = fleet.ClassOf(agent, labels); !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

func positiveDuration(getenv func(string) string, name string) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive Go duration such as 10s", name, v)
	}
	return d, nil
}
