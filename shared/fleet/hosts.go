package fleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
)

// checkID refuses an id without runspec.IDPattern's shape: host ids and
// label keys have the shape of the agents and projects a run names.
func checkID(field, id string) *Error {
	if err := runspec.CheckID(field, id); err != nil {
		return invalid("%s", err.Error())
	}
	return nil
}

// HostSpec is a registration: POST /fleet/hosts.
type HostSpec struct {
	ID            string
	BaseURL       string
	CredentialRef string
	Labels        map[string]string
	LocalPaths    []string
	CAPEM         string
	// Enabled nil means true.
	Enabled *bool
}

// RegisterHost validates spec and adds the host. The baseUrl must be https,
// or http on a loopback address only; the credentialRef must resolve now (an
// unknown one is a 400 here rather than an auth_fail probe later); caPem,
// when given, must parse.
func (f *Fleet) RegisterHost(ctx context.Context, spec HostSpec) (store.Host, error) {
	if err := checkID("id", spec.ID); err != nil {
		return store.Host{}, err
	}
	base, err := checkBaseURL(spec.BaseURL)
	if err != nil {
		return store.Host{}, err
	}
	if err := credentials.CheckRef(spec.CredentialRef); err != nil {
		return store.Host{}, invalid("%v", err)
	}
	if _, err := f.cfg.Credentials.Secret(ctx, spec.CredentialRef); err != nil {
		if errors.Is(err, credentials.ErrUnknownRef) {
			return store.Host{}, &Error{Kind: KindInvalid, Code: CodeUnknownCredential,
				Message: fmt.Sprintf("credentialRef %q is unknown to the credential source", spec.CredentialRef)}
		}
		return store.Host{}, fmt.Errorf("fleet: resolving credentialRef %q: %w", spec.CredentialRef, err)
	}
	if spec.CAPEM != "" {
		if base.Scheme != "https" {
			return store.Host{}, invalid("caPem: only an https baseUrl uses a CA")
		}
		if err := checkCAPEM(spec.CAPEM); err != nil {
			return store.Host{}, err
		}
		if _, err := hostproto.CAPool(spec.CAPEM); err != nil {
			return store.Host{}, invalid("caPem: %v", strings.TrimPrefix(err.Error(), "hostproto: caPem "))
		}
	}
	if err := checkLabels(spec.Labels); err != nil {
		return store.Host{}, err
	}
	if len(spec.LocalPaths) > MaxLocalPaths {
		return store.Host{}, invalid("localPaths: %d paths; at most %d", len(spec.LocalPaths), MaxLocalPaths)
	}
	paths := make([]string, 0, len(spec.LocalPaths))
	for i, p := range spec.LocalPaths {
		if !path.IsAbs(p) || len(p) > runspec.MaxPathBytes || strings.ContainsRune(p, 0) {
			return store.Host{}, invalid("localPaths[%d] %s: want an absolute path of at most %d bytes", i, runspec.Quoted(p), runspec.MaxPathBytes)
		}
		paths = append(paths, path.Clean(p))
	}
	h := store.Host{
		ID:            spec.ID,
		BaseURL:       strings.TrimSuffix(base.String(), "/"),
		CredentialRef: spec.CredentialRef,
		Labels:        spec.Labels,
		LocalPaths:    paths,
		CAPEM:         spec.CAPEM,
		Enabled:       spec.Enabled == nil || *spec.Enabled,
		CreatedAt:     f.clock.Now().UTC(),
	}
	if err := f.store.CreateHost(ctx, h); err != nil {
		if errors.Is(err, store.ErrExists) {
			return store.Host{}, conflict(CodeHostExists, nil, "host %q is already registered", spec.ID)
		}
		return store.Host{}, fmt.Errorf("fleet: registering host %q: %w", spec.ID, err)
	}
	return h, nil
}

// checkBaseURL accepts https://host[:port][/path], or http:// only when the
// host is a loopback address (or "localhost"): a bearer credential never
// crosses a network in clear text.
func checkBaseURL(raw string) (*url.URL, *Error) {
	if len(raw) > MaxBaseURLBytes {
		return nil, invalid("baseUrl: %d bytes; at most %d", len(raw), MaxBaseURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return nil, invalid("baseUrl %s: want an absolute URL such as https://host:7070", runspec.Quoted(raw))
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, invalid("baseUrl %s: must not carry credentials, a query or a fragment", runspec.Quoted(raw))
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !loopbackHost(u.Hostname()) {
			return nil, invalid("baseUrl %s: http:// is allowed only on loopback; use https://", runspec.Quoted(raw))
		}
	default:
		return nil, invalid("baseUrl %s: want https:// (or http:// on loopback)", runspec.Quoted(raw))
	}
	return u, nil
}

// checkLabels bounds labels (a host's or a dispatch's): at most MaxLabels,
// keys of the id shape, values of 1 to MaxLabelValue bytes.
func checkLabels(labels map[string]string) *Error {
	if len(labels) > MaxLabels {
		return invalid("labels: %d labels; at most %d", len(labels), MaxLabels)
	}
	for k, v := range labels {
		if err := checkID("labels key", k); err != nil {
			return err
		}
		if v == "" || len(v) > MaxLabelValue {
			return invalid("labels[%q]: want a value of 1-%d bytes", k, MaxLabelValue)
		}
	}
	return nil
}

func loopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// SetHostEnabled enables or disables a host and rebuilds the routing view;
// an enabled host is woken (Wake) for the runs waiting for room.
func (f *Fleet) SetHostEnabled(ctx context.Context, id string, enabled bool) (store.Host, error) {
	if e := hostPathID(id); e != nil {
		return store.Host{}, e
	}
	h, err := f.store.SetHostEnabled(ctx, id, enabled)
	if errors.Is(err, store.ErrNotFound) {
		return store.Host{}, notFound("host %q is not registered", id)
	}
	if err != nil {
		return store.Host{}, fmt.Errorf("fleet: setting host %q enabled: %w", id, err)
	}
	// A disable would be seen anyway (dispatch re-reads the host it
	// chooses); an enable is seen at once only because the view is rebuilt.
	if err := f.RefreshRouteView(ctx); err != nil {
		return store.Host{}, err
	}
	if enabled {
		// Runs waiting for room may start there now.
		f.wake(ctx, Wake{HostID: h.ID, Slots: freeSlots(h), Reason: WakeEnabled})
	}
	return h, nil
}

// DeleteHost does one bounded step of removing a host
// (store.Store.DeleteHost): refused (409) while runs reference it, unless
// force, which discards them and their events a page per call. A forced
// delete first disables the host, so routing excludes it (disabled) from
// the first call on, while the runs go over several calls; Done says the
// host is gone. Repeating the call continues where the last one stopped.
func (f *Fleet) DeleteHost(ctx context.Context, id string, force bool) (store.HostDeletion, error) {
	if e := hostPathID(id); e != nil {
		return store.HostDeletion{}, e
	}
	var err error
	if force {
		_, err = f.store.SetHostEnabled(ctx, id, false)
	}
	var res store.HostDeletion
	if err == nil {
		res, err = f.store.DeleteHost(ctx, id, force)
	}
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, store.ErrNotFound):
		return res, notFound("host %q is not registered", id)
	case errors.Is(err, store.ErrInUse):
		return res, conflict(CodeHostInUse, nil, "host %q is still referenced by runs; delete with ?force=1 to discard them", id)
	}
	return res, fmt.Errorf("fleet: deleting host %q: %w", id, err)
}

// Hosts lists the hosts c may see, each with its last probe, ordered by id.
func (f *Fleet) Hosts(ctx context.Context, c store.Caller) ([]store.Host, error) {
	all, err := f.store.ListHosts(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: listing hosts: %w", err)
	}
	visible := all[:0]
	for _, h := range all {
		if auth.CanUseHost(c, h.ID) {
			visible = append(visible, h)
		}
	}
	sort.Slice(visible, func(i, j int) bool { return visible[i].ID < visible[j].ID })
	return visible, nil
}

// Host returns one host (admin use: no scope check).
func (f *Fleet) Host(ctx context.Context, id string) (store.Host, error) {
	if e := hostPathID(id); e != nil {
		return store.Host{}, e
	}
	h, err := f.store.GetHost(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Host{}, notFound("host %q is not registered", id)
	}
	if err != nil {
		return store.Host{}, fmt.Errorf("fleet: reading host %q: %w", id, err)
	}
	return h, nil
}

// clientFor returns a client for the API of the registered host hostID,
// its record read now.
func (f *Fleet) clientFor(ctx context.Context, hostID string) (*hostproto.Client, error) {
	h, err := f.store.GetHost(ctx, hostID)
	if err != nil {
		return nil, fmt.Errorf("fleet: reading host %q: %w", hostID, err)
	}
	return f.HostClient(ctx, h, 0)
}

// HostClient returns a client for h's API, with its credential and CA, whose
// calls are bounded by timeout (zero: the configured HostTimeout).
func (f *Fleet) HostClient(ctx context.Context, h store.Host, timeout time.Duration) (*hostproto.Client, error) {
	token, err := f.cfg.Credentials.Secret(ctx, h.CredentialRef)
	if err != nil {
		return nil, fmt.Errorf("fleet: host %q credential: %w", h.ID, err)
	}
	t, err := f.transport(h.CAPEM)
	if err != nil {
		return nil, fmt.Errorf("fleet: host %q CA: %w", h.ID, err)
	}
	if timeout <= 0 {
		timeout = f.cfg.HostTimeout
	}
	c, err := hostproto.NewClient(hostproto.ClientConfig{BaseURL: h.BaseURL, Token: token, Timeout: timeout, Transport: t,
		MaxEventPageBytes: f.cfg.MaxEventPageBytes})
	if err != nil {
		return nil, fmt.Errorf("fleet: host %q client: %w", h.ID, err)
	}
	return c, nil
}

// HostDrain is what a drain or resume did: the host's outcome as the verbs
// on runs map it (accepted true, false or "unknown", never a success the
// host did not confirm), the host's state as it answered (zero when it did
// not accept), and the host as recorded after.
type HostDrain struct {
	Outcome hostproto.Outcome
	State   hostproto.DrainState
	Host    store.Host
}

// DrainHost asks the host to admit nothing new and records the drain on
// its probe at once, so routing excludes it (draining) from the next
// dispatch on, not only after the next probe: dispatch re-reads a chosen
// host strongly consistent, and the routing view is rebuilt. The drain is
// recorded even when the host did not confirm it: an operator draining a
// host means Fleet to stop sending it work either way.
func (f *Fleet) DrainHost(ctx context.Context, id string) (HostDrain, error) {
	return f.setDraining(ctx, id, true)
}

// ResumeHost asks the host to admit runs again; once it confirms, the
// drain is cleared on its probe and in the routing view, and the host is
// woken (Wake) for the runs waiting for room. A resume the host did not
// confirm changes nothing in Fleet.
func (f *Fleet) ResumeHost(ctx context.Context, id string) (HostDrain, error) {
	return f.setDraining(ctx, id, false)
}

func (f *Fleet) setDraining(ctx context.Context, id string, draining bool) (HostDrain, error) {
	verb := "resume"
	if draining {
		verb = "drain"
	}
	h, err := f.Host(ctx, id)
	if err != nil {
		return HostDrain{}, err
	}
	client, err := f.HostClient(ctx, h, 0)
	if err != nil {
		return HostDrain{}, fmt.Errorf("fleet: %s: %w", verb, err)
	}
	// As the verbs on runs: the call and its record outlive a caller that
	// hangs up, bounded by HostTimeout.
	recordCtx := context.WithoutCancel(ctx)
	callCtx, cancel := context.WithTimeout(recordCtx, f.cfg.HostTimeout)
	call := client.Resume
	if draining {
		call = client.Drain
	}
	st, callErr := call(callCtx)
	cancel()
	out := HostDrain{Outcome: hostproto.OutcomeOf(callErr), Host: h}
	if callErr != nil {
		f.log.Warn("host verb not accepted", logVerb, verb, logHost, id, "accepted", outcomeWord(out.Outcome.Accepted), logErr, callErr.Error())
		if !draining {
			return out, nil
		}
	} else {
		out.State = st
		draining = st.Draining
	}
	if out.Host, err = f.store.RecordDrain(recordCtx, id, draining, out.State.Idle); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return HostDrain{}, notFound("host %q was deleted during the %s", id, verb)
		}
		return HostDrain{}, fmt.Errorf("fleet: %s: recording it on host %q: %w", verb, id, err)
	}
	if err := f.RefreshRouteView(recordCtx); err != nil {
		return HostDrain{}, err
	}
	if callErr == nil && !draining {
		// Resumed: runs waiting for room may start there now.
		f.wake(recordCtx, Wake{HostID: id, Slots: freeSlots(out.Host), Reason: WakeResumed})
	}
	return out, nil
}
