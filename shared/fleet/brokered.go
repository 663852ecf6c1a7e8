package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/emf"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// Credentials Fleet mints (DESIGN.md, "Credentials Fleet mints"). A
// declared secret whose key Config.Broker has a recipe for is a brokered
// key. Dispatch mints its value before the run or its idempotency item is
// written, so a failure leaves nothing behind (409 credential_unavailable),
// sends it in the start request, and records on the run what it minted:
// never the value, only its expiry and, for a run's own token (githubApp),
// its sealed form, which Fleet needs to revoke it. While the run is live,
// the sweep sends a fresh value (PUT /runs/{id}/credentials) before the one
// the host holds expires, or when the host says it lost it (a restart),
// and revokes the token it replaced; when the run has ended and left the
// live index, Fleet revokes its tokens. A value is a
// hostproto.SecretString, which never prints: no log line or error here
// carries one.

// The broker's metrics (emf, namespace Runfleet, dimension Kind: the
// recipe's kind), one line with the value 1 per event. The broker reports
// its own events (BrokerMetrics, its OnEvent hook); Fleet adds the
// deliveries a host did not take.
const (
	// MetricBrokerMints counts values handed out for runs (a fresh GitHub
	// token, or the current OAuth2 access token), at dispatch and by the
	// sweep.
	MetricBrokerMints = "BrokerMints"
	// MetricBrokerRefreshes counts OAuth2 refresh tokens exchanged at the
	// provider: one per expiry of the fleet-wide access token.
	MetricBrokerRefreshes = "BrokerRefreshes"
	// MetricBrokerFailures counts mints, refreshes and revocations that
	// failed, and fresh values a live run's host did not take.
	MetricBrokerFailures = "BrokerFailures"
	// MetricBrokerRevocations counts a run's tokens revoked.
	MetricBrokerRevocations = "BrokerRevocations"
	// metricDimensionKind is the metrics' one dimension.
	metricDimensionKind = "Kind"
)

// brokerEventMetrics names the metric of each event the broker reports.
var brokerEventMetrics = map[string]string{
	broker.EventMint:       MetricBrokerMints,
	broker.EventRefresh:    MetricBrokerRefreshes,
	broker.EventFailure:    MetricBrokerFailures,
	broker.EventRevocation: MetricBrokerRevocations,
}

// BrokerMetrics is the broker's OnEvent hook (broker.Deps.OnEvent): each
// event it reports becomes one metric line on w at clk's now; an event it
// does not know is logged and dropped. A nil w writes nothing.
func BrokerMetrics(w *emf.Writer, clk clock.Clock, log *slog.Logger) func(kind, event string) {
	return func(kind, event string) {
		metric, ok := brokerEventMetrics[event]
		if !ok {
			log.Error("a broker event no metric counts", "event", event, logKind, kind)
			return
		}
		writeCount(w, clk, log, metric, kind)
	}
}

// writeCount writes one event of a broker metric for a recipe kind.
func writeCount(w *emf.Writer, clk clock.Clock, log *slog.Logger, metric, kind string) {
	m := emf.Metric{Name: metric, Unit: emf.UnitCount, Value: 1, Dimensions: map[string]string{metricDimensionKind: kind}}
	if err := w.Write(clk.Now(), m); err != nil {
		log.Error("writing a broker metric", "metric", metric, logErr, err.Error())
	}
}

// Log field names of the broker's lines: a key is named
// "<projectId>/<KEY>", never with its value.
const (
	logKey  = "key"
	logKind = "kind"
)

// CredentialRefusal is the Details of a credential_unavailable refusal:
// the brokered key that could not be minted, its recipe's kind and the
// provider's HTTP status (0: not reached).
type CredentialRefusal struct {
	ProjectID      string
	Key            string
	Kind           string
	ProviderStatus int
}

// brokeredSecret is one brokered key of a run.
type brokeredSecret struct {
	projectID, key, kind string
}

func (b brokeredSecret) id() string { return b.projectID + "/" + b.key }

// mintedValue is a value minted for one brokered key of a run.
type mintedValue struct {
	brokeredSecret
	minted broker.Minted
}

// brokeredSecrets are r's declared secrets whose key the broker has a
// recipe for, in the order declared, with each one's index in r's secrets.
func (f *Fleet) brokeredSecrets(r DispatchRequest) ([]brokeredSecret, []int) {
	if f.cfg.Broker == nil {
		return nil, nil
	}
	var out []brokeredSecret
	var at []int
	for i, s := range r.Run.Secrets {
		if kind, ok := f.cfg.Broker.Kind(s.ProjectID, s.Key); ok {
			out = append(out, brokeredSecret{projectID: s.ProjectID, key: s.Key, kind: kind})
			at = append(at, i)
		}
	}
	return out, at
}

// mintForDispatch mints a value for each brokered key of r, for the run
// runID. When one cannot be minted, the tokens minted before it are
// revoked and the dispatch is refused: 409 credential_unavailable naming
// the key (its secrets index), its kind and the provider's status. A
// context that ended is returned as such (the caller's time ran out).
func (f *Fleet) mintForDispatch(ctx context.Context, runID string, r DispatchRequest) ([]mintedValue, error) {
	keys, at := f.brokeredSecrets(r)
	var out []mintedValue
	for i, k := range keys {
		m, err := f.cfg.Broker.Mint(ctx, broker.MintRequest{FleetRunID: runID, ProjectID: k.projectID, Key: k.key, Repository: r.Run.Repository})
		if err == nil {
			out = append(out, mintedValue{brokeredSecret: k, minted: m})
			continue
		}
		f.revokeMinted(ctx, runID, r.Run.Repository, out, "the dispatch was refused")
		if ctx.Err() != nil {
			return nil, fmt.Errorf("fleet: minting %s: %w", k.id(), ctx.Err())
		}
		return nil, f.mintRefusal(runID, at[i], k, err)
	}
	return out, nil
}

// mintRefusal is the 409 of a brokered key the broker could not mint. A
// *broker.Error's facts hold no value and are shown; any other error is
// the broker's fault, logged and not shown.
func (f *Fleet) mintRefusal(runID string, index int, k brokeredSecret, err error) *Error {
	details := CredentialRefusal{ProjectID: k.projectID, Key: k.key, Kind: k.kind}
	detail := "Fleet's broker failed (see Fleet's log)"
	var be *broker.Error
	if errors.As(err, &be) {
		details.ProviderStatus = be.ProviderStatus
		detail = be.Detail
		if be.ProviderStatus != 0 {
			detail += fmt.Sprintf(" (the provider answered %d)", be.ProviderStatus)
		}
	}
	f.log.Warn("dispatch: a brokered key could not be minted; refused", logRun, runID, logKey, k.id(), logKind, k.kind, logErr, err.Error())
	return conflict(CodeCredentialUnavailable, details,
		"secrets[%d]: Fleet could not mint %s (%s): %s; no run was started", index, k.id(), k.kind, detail)
}

// revokeMinted revokes the run's own tokens among values minted for the
// run runID, which no run record names (a dispatch that ended without
// using them): a failure is logged and counted, and the token expires by
// itself.
func (f *Fleet) revokeMinted(ctx context.Context, runID, repository string, values []mintedValue, why string) {
	for _, v := range values {
		if v.minted.Sealed == nil {
			continue
		}
		req := broker.MintRequest{FleetRunID: runID, ProjectID: v.projectID, Key: v.key, Repository: repository}
		if err := f.revoke(ctx, req, v.minted.Sealed); err != nil {
			f.log.Warn("credentials: revoking an unused token failed; it expires by itself", logRun, runID, logKey, v.id(),
				logKind, v.kind, logReason, why, logErr, err.Error())
		}
	}
}

// revoke revokes one token, minted for req, bounded by HostTimeout whatever
// the caller's context.
func (f *Fleet) revoke(ctx context.Context, req broker.MintRequest, sealed []byte) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.HostTimeout)
	defer cancel()
	return f.cfg.Broker.Revoke(rctx, req, sealed)
}

// credentialCounts are what a pass did with brokered values (the sweep
// reports them).
type credentialCounts struct {
	refreshed int // fresh values a host took
	revoked   int // tokens revoked
	failures  int // mints, deliveries and revocations that failed
}

func (c *credentialCounts) add(o credentialCounts) {
	c.refreshed += o.refreshed
	c.revoked += o.revoked
	c.failures += o.failures
}

// Why a brokered key of a live run is due a fresh value.
const (
	// dueMissing: the host says it holds no value for it (it restarted).
	dueMissing = "missing"
	// dueRevoked: Fleet revoked its token when the run ended, and a retry
	// made the run live again.
	dueRevoked = "revoked"
	// dueExpiring: less than broker.RefreshMargin is left.
	dueExpiring = "expiring"
)

// credentialsInput is what dueCredentials decides on.
type credentialsInput struct {
	// Keys are the run's brokered keys as recorded.
	Keys []store.BrokeredKey
	// Missing are the keys the host holds no value for
	// (hostproto.Run.MissingCredentials: "<projectId>/<KEY>").
	Missing []string
	// HostStatus is the run's status on its host, read with Missing.
	HostStatus string
	Now        time.Time
}

// dueCredential is one key due a fresh value: its index in Keys, and why.
type dueCredential struct {
	Index  int
	Reason string
}

// dueCredentials decides which of a run's brokered keys need a fresh
// value now: none of a run that has ended on its host (it uses none);
// otherwise each key the host lost, each whose token Fleet revoked, and
// each with less than broker.RefreshMargin left (an unknown expiry
// included), in that order of reasons, in the order recorded.
func dueCredentials(in credentialsInput) []dueCredential {
	if hostproto.TerminalStatus(in.HostStatus) {
		return nil
	}
	var out []dueCredential
	for i, k := range in.Keys {
		switch {
		case slices.Contains(in.Missing, k.ProjectID+"/"+k.Key):
			out = append(out, dueCredential{i, dueMissing})
		case k.RevokedAt != nil:
			out = append(out, dueCredential{i, dueRevoked})
		case k.ExpiresAt.Sub(in.Now) < broker.RefreshMargin:
			out = append(out, dueCredential{i, dueExpiring})
		}
	}
	return out
}

// refreshCredentials sends the host of a live run (hr: its state there,
// just read) a fresh value of each brokered key that is due
// (dueCredentials), records them on the run and then revokes the tokens
// they replaced. A key that cannot be minted keeps the value the host
// has (logged, counted; the next pass tries again). A delivery the host
// refused, or that never reached it, revokes the fresh tokens; one whose
// outcome is unknown revokes nothing and records nothing (the next pass
// sends again; a token the host may hold is never revoked). A record that
// changed meanwhile (another refresher) is left as it is. It returns the
// run as stored after.
func (f *Fleet) refreshCredentials(ctx context.Context, client *hostproto.Client, run store.Run, hr hostproto.Run) (store.Run, credentialCounts) {
	var cc credentialCounts
	if f.cfg.Broker == nil || len(run.Brokered) == 0 {
		return run, cc
	}
	due := dueCredentials(credentialsInput{Keys: run.Brokered, Missing: hr.MissingCredentials, HostStatus: hr.Status, Now: f.clock.Now()})
	if len(due) == 0 {
		return run, cc
	}
	var fresh []mintedValue
	var was []store.BrokeredKey // the record each fresh value replaces, as read
	var why []string
	for _, d := range due {
		k := run.Brokered[d.Index]
		b := brokeredSecret{projectID: k.ProjectID, key: k.Key, kind: k.Kind}
		m, err := f.cfg.Broker.Mint(ctx, runKeyRequest(run, k))
		if err != nil {
			cc.failures++
			f.log.Warn("credentials: minting a fresh value failed; the host keeps the one it has", logRun, run.FleetRunID,
				logKey, b.id(), logKind, k.Kind, logReason, d.Reason, logErr, err.Error())
			continue
		}
		if d.Reason == dueExpiring && m.Sealed == nil && !m.ExpiresAt.After(k.ExpiresAt) {
			// The fleet-wide value the host holds already (the broker
			// refreshes it once it is within its margin): nothing to send.
			continue
		}
		fresh = append(fresh, mintedValue{brokeredSecret: b, minted: m})
		was = append(was, k)
		why = append(why, b.id()+" ("+d.Reason+")")
	}
	if len(fresh) == 0 {
		return run, cc
	}
	callCtx, cancel := context.WithTimeout(ctx, f.cfg.HostTimeout)
	_, err := client.PutCredentials(callCtx, run.ChildRunID, hostproto.CredentialsRequest{Credentials: brokeredValues(fresh)})
	cancel()
	if err != nil {
		for _, v := range fresh {
			cc.failures++
			writeCount(f.cfg.Metrics, f.clock, f.log, MetricBrokerFailures, v.kind)
		}
		if hostproto.OutcomeOf(err).Accepted == hostproto.Refused {
			f.log.Warn("credentials: the host did not take fresh values; revoking them", logRun, run.FleetRunID, logHost, run.HostID,
				logKey, strings.Join(why, ", "), logErr, err.Error())
			f.revokeMinted(ctx, run.FleetRunID, run.Repository, fresh, "the host did not take it")
		} else {
			f.log.Warn("credentials: whether the host took fresh values is unknown; sending again next pass", logRun, run.FleetRunID,
				logHost, run.HostID, logKey, strings.Join(why, ", "), logErr, err.Error())
		}
		return run, cc
	}
	var replaced []store.BrokeredKey
	stored, err := f.settle(context.WithoutCancel(ctx), run, func(cur *store.Run) bool {
		replaced = nil
		cur.Brokered = slices.Clone(cur.Brokered)
		changed := false
		for j, v := range fresh {
			i := slices.IndexFunc(cur.Brokered, func(k store.BrokeredKey) bool { return k.ProjectID == v.projectID && k.Key == v.key })
			if i < 0 || !sameBrokeredKey(cur.Brokered[i], was[j]) {
				continue // another refresher recorded its own value meanwhile
			}
			if old := cur.Brokered[i]; old.Sealed != nil && old.RevokedAt == nil {
				replaced = append(replaced, old)
			}
			cur.Brokered[i] = brokeredKeyOf(v)
			changed = true
		}
		return changed
	})
	if err != nil {
		f.log.Error("credentials: the host took fresh values, but recording them failed", logRun, run.FleetRunID,
			logKey, strings.Join(why, ", "), logErr, err.Error())
		return run, cc
	}
	cc.refreshed += len(fresh)
	f.log.Info("credentials: fresh values sent to the run's host", logRun, run.FleetRunID, logHost, run.HostID, logKey, strings.Join(why, ", "))
	for _, old := range replaced {
		if err := f.revoke(ctx, runKeyRequest(run, old), old.Sealed); err != nil {
			cc.failures++
			f.log.Warn("credentials: revoking a replaced token failed; it expires by itself", logRun, run.FleetRunID,
				logKey, old.ProjectID+"/"+old.Key, logKind, old.Kind, logErr, err.Error())
			continue
		}
		cc.revoked++
	}
	return stored, cc
}

// runKeyRequest is the request that mints (and revokes) a value of run's
// key k: the broker seals a run's token bound to the run and the key.
func runKeyRequest(run store.Run, k store.BrokeredKey) broker.MintRequest {
	return broker.MintRequest{FleetRunID: run.FleetRunID, ProjectID: k.ProjectID, Key: k.Key, Repository: run.Repository}
}

// sameBrokeredKey reports whether a recorded key is still the one read.
func sameBrokeredKey(a, b store.BrokeredKey) bool {
	return a.ExpiresAt.Equal(b.ExpiresAt) && bytes.Equal(a.Sealed, b.Sealed) && (a.RevokedAt == nil) == (b.RevokedAt == nil)
}

// revocable are the indexes of keys whose token Fleet may still revoke at
// now: the run's own (sealed), not revoked, not yet expired (an expired
// token needs no revocation).
func revocable(keys []store.BrokeredKey, now time.Time) []int {
	var out []int
	for i, k := range keys {
		if k.Sealed != nil && k.RevokedAt == nil && now.Before(k.ExpiresAt) {
			out = append(out, i)
		}
	}
	return out
}

// revokeEnded revokes the tokens of a run that has ended and left the live
// index (a retry would make it live again, with tokens of its own), and
// records when (RevokedAt). The revocations are claimed first, in one
// versioned write, so that of two passes ending the same run only one
// revokes; one that fails is logged, counted and its claim withdrawn (the
// record never says a token was revoked that was not; it expires by
// itself, and a later GET of the run tries again). Draining never waits
// on it: the run is drained already. It returns the run as stored after.
func (f *Fleet) revokeEnded(ctx context.Context, run store.Run) (store.Run, credentialCounts) {
	var cc credentialCounts
	now := f.clock.Now().UTC()
	if f.cfg.Broker == nil || run.Live() || len(revocable(run.Brokered, now)) == 0 {
		return run, cc
	}
	ctx = context.WithoutCancel(ctx)
	var claimed []store.BrokeredKey
	stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
		claimed = nil
		idx := revocable(cur.Brokered, now)
		if cur.Live() || len(idx) == 0 {
			return false
		}
		cur.Brokered = slices.Clone(cur.Brokered)
		for _, i := range idx {
			claimed = append(claimed, cur.Brokered[i])
			cur.Brokered[i].RevokedAt = &now
		}
		return true
	})
	if err != nil {
		f.log.Warn("credentials: recording the revocation of an ended run's tokens failed", logRun, run.FleetRunID, logErr, err.Error())
		return run, cc
	}
	var failed []store.BrokeredKey
	for _, k := range claimed {
		if err := f.revoke(ctx, runKeyRequest(run, k), k.Sealed); err != nil {
			cc.failures++
			failed = append(failed, k)
			f.log.Warn("credentials: revoking an ended run's token failed; it expires by itself", logRun, run.FleetRunID,
				logKey, k.ProjectID+"/"+k.Key, logKind, k.Kind, logErr, err.Error())
			continue
		}
		cc.revoked++
	}
	if len(failed) == 0 {
		return stored, cc
	}
	stored, err = f.settle(ctx, stored, func(cur *store.Run) bool {
		cur.Brokered = slices.Clone(cur.Brokered)
		changed := false
		for i, k := range cur.Brokered {
			if k.RevokedAt != nil && k.RevokedAt.Equal(now) && slices.ContainsFunc(failed, func(x store.BrokeredKey) bool { return bytes.Equal(x.Sealed, k.Sealed) }) {
				cur.Brokered[i].RevokedAt = nil
				changed = true
			}
		}
		return changed
	})
	if err != nil {
		f.log.Warn("credentials: withdrawing a failed revocation's record failed", logRun, run.FleetRunID, logErr, err.Error())
	}
	return stored, cc
}
