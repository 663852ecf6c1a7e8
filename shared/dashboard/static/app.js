// runfleet's dashboard: one page, hash routes (#/runs, #/runs/<id>,
// #/hosts), every call to Fleet's API with the signed-in caller's bearer
// token, kept in this tab's sessionStorage only (never localStorage, a
// cookie or a URL). It shows what the API answers to that token and nothing
// else: scoping is the API's. Text from Fleet (a run's output above all)
// reaches the page only through textContent and text nodes, never as HTML;
// the Content-Security-Policy (Trusted Types required, no policy allowed)
// makes any HTML sink throw, so a mistake fails loudly rather than runs.
//
// Stable hooks for tests (ids unless said; data-testid equals the id):
//   sign in:   #signin-form, #signin-token (input), #signin-submit,
//              #signin-message (why the sign-in page is shown: a 401's error)
//   header:    #nav-runs, #nav-hosts, #whoami, #signout
//   errors:    #error-banner (data-code, data-status; data-kind "error" or
//              "notice"), its #error-message ("<error> (<code>)"), #error-close
//   hosts:     #hosts-table, rows tr[data-host-id], cells td[data-col=...]
//              (state, probe, agents, load, storage, version, probed);
//              admin buttons button[data-action=drain|resume|probe] in a row;
//              #hosts-refresh
//   runs:      #runs-filter (form), #filter-status (select), #filter-agent,
//              #filter-host, #filter-apply, #runs-refresh, #runs-table, rows
//              tr[data-run-id] (td[data-col=status] carries data-status, and
//              for a queued run .queue-place[data-queue-position]), #runs-older
//              (the next page), #runs-empty
//   run page:  #run-page[data-run-id], #run-status (data-status), #run-state
//              (dd[data-field=...]; dd[data-field=queue] holds a run's wait:
//              [data-queue=position|class|since|until|timeout|waited|started|
//              started-on]), #run-cancel, #run-retry,
//              #run-stream-state (data-state: connecting, live, waiting,
//              done, error), #run-output (the output, text only),
//              #run-output-trimmed, #run-events (li[data-seq][data-type]),
//              #egress-summary, #egress-table (tr[data-egress-seq]),
//              #egress-empty, #egress-more, #egress-reload
'use strict';

(() => {
  const TOKEN_KEY = 'runfleet.token';
  const STATUSES = ['queued', 'dispatching', 'pending', 'admitted', 'running', 'succeeded', 'failed', 'canceled', 'lost'];
  const TERMINAL = new Set(['succeeded', 'failed', 'canceled', 'lost']);
  const RUNS_REFRESH_MS = 10000;
  const OUTPUT_MAX_CHARS = 1000000;

  const $ = (id) => document.getElementById(id);
  const getToken = () => sessionStorage.getItem(TOKEN_KEY) || '';

  // el builds an element: attrs are attributes (data-* included; false and
  // null leave one out), children are nodes or strings (as text).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === false || v === null || v === undefined) continue;
      if (k === 'text') e.textContent = String(v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const withId = (id, attrs) => Object.assign({ id, 'data-testid': id }, attrs);

  // ---- the API

  class ApiError extends Error {
    constructor(status, body) {
      const b = body && typeof body === 'object' ? body : {};
      super(b.error || b.message || (status ? 'HTTP ' + status : 'no answer'));
      this.status = status;
      this.code = b.code || '';
      this.body = b;
    }
  }

  // call sends one request and answers {status, body}; a status of 400 or
  // more throws an ApiError (a 401 signs out first, unless token is given:
  // the sign-in form's check).
  async function call(method, url, opts = {}) {
    const token = opts.token || getToken();
    const init = {
      method, cache: 'no-store', credentials: 'omit', redirect: 'error', signal: opts.signal,
      headers: { Authorization: 'Bearer ' + token, Accept: 'application/json' },
    };
    let resp;
    try {
      resp = await fetch(url, init);
    } catch (e) {
      if (opts.signal && opts.signal.aborted) throw e;
      throw new ApiError(0, { error: 'Fleet could not be reached: ' + e.message, code: 'network' });
    }
    const text = await resp.text();
    let body = null;
    try { body = JSON.parse(text); } catch (_) { body = { error: text.slice(0, 300) || resp.statusText }; }
    if (resp.status >= 400) {
      const err = new ApiError(resp.status, body);
      if (resp.status === 401 && !opts.token) signOut(err);
      throw err;
    }
    return { status: resp.status, body };
  }

  const pathOf = (...parts) => parts.map((p) => '/' + encodeURIComponent(p)).join('');

  // ---- the error banner

  function banner(kind, err) {
    const b = $('error-banner');
    b.replaceChildren(el('span', withId('error-message', { text: err instanceof ApiError && err.code ? `${err.message} (${err.code})` : String(err.message || err) })),
      el('button', withId('error-close', { type: 'button', 'aria-label': 'Dismiss', text: '\u00d7' })));
    b.dataset.kind = kind;
    b.dataset.code = (err && err.code) || '';
    b.dataset.status = (err && err.status) || '';
    b.hidden = false;
    $('error-close').addEventListener('click', clearBanner);
  }
  // A 401 is shown by the sign-in page it leads to; an abort is the page's own.
  const showError = (err) => { if (err && err.name !== 'AbortError' && err.status !== 401) banner('error', err); };
  const showNotice = (text) => banner('notice', { message: text });
  function clearBanner() { const b = $('error-banner'); b.hidden = true; b.replaceChildren(); }

  // ---- formatting

  function age(ts) {
    if (!ts) return '';
    const s = Math.max(0, (Date.now() - Date.parse(ts)) / 1000);
    if (s < 60) return Math.floor(s) + 's ago';
    if (s < 3600) return Math.floor(s / 60) + 'm ago';
    if (s < 86400) return Math.floor(s / 3600) + 'h ago';
    return Math.floor(s / 86400) + 'd ago';
  }
  const time = (ts) => ts ? el('time', { datetime: ts, title: ts, text: new Date(ts).toLocaleString() }) : '';
  const ageCell = (ts) => ts ? el('time', { datetime: ts, title: ts, text: age(ts) }) : '';
  function bytes(n) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + ' ' + u[i];
  }
  const count = (n, noun) => `${n} ${noun}${n === 1 ? '' : 's'}`;
  const statusBadge = (s, id) => el('span', Object.assign(id ? withId(id) : {}, { class: 'status s-' + s, 'data-status': s, text: s }));
  // A run waits for a host while queued, and while dispatching after it
  // waited (a host is being offered it).
  const waiting = (r) => r.status === 'queued' || (r.status === 'dispatching' && !!r.queue && !r.queue.startedAt);
  const part = (name, ...c) => el('span', { 'data-queue': name }, ...c);
  // queuePlace is a waiting run's place for a list: "#2 in shell, since
  // 1m ago, until <time>" (no position where the list does not say it).
  function queuePlace(q) {
    return el('span', { class: 'queue-place', 'data-queue-position': q.position || '', title: `waiting up to ${q.timeout}` },
      q.position ? '#' + q.position + ' in ' : 'in ', q.class, ', since ', ageCell(q.since), ', until ', time(q.until));
  }
  // queueParts is a run's wait for its page: its place while it waits,
  // how long it waited once a host took it, or that none did.
  function queueParts(q, r) {
    if (!q) return [];
    const cls = [part('class', q.class), q.priority ? ` (priority ${q.priority})` : null];
    const waited = part('waited', duration(q.waitedSeconds));
    if (q.startedAt) return ['waited ', waited, ' in ', ...cls, '; started ', part('started', time(q.startedAt)), ' on ', part('started-on', q.startedOn)];
    if (!waiting(r)) return ['waited ', waited, ' in ', ...cls, '; never started'];
    return [q.position ? part('position', 'position ' + q.position) : null, q.position ? ' in ' : 'in ', ...cls,
      ', waiting since ', part('since', time(q.since)), ', until ', part('until', time(q.until)), ' (timeout ', part('timeout', q.timeout), ')'];
  }
  function duration(seconds) {
    const s = Math.max(0, Math.round(seconds || 0));
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
    return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  }

  // ---- views and the router

  let view = null; // {ctl: AbortController, timers: []} of the page shown

  function leaveView() {
    if (!view) return;
    view.ctl.abort();
    view.timers.forEach(clearInterval);
    view = null;
  }
  function enterView() {
    leaveView();
    clearBanner();
    view = { ctl: new AbortController(), timers: [] };
    return view;
  }

  function route() {
    const v = enterView();
    const signedIn = getToken() !== '';
    $('nav').hidden = !signedIn;
    $('signout').hidden = !signedIn;
    if (!signedIn) return signInView(v, '');
    const [path, query] = (location.hash.replace(/^#/, '') || '/runs').split('?');
    const parts = path.split('/').filter(Boolean);
    if (parts[0] === 'hosts' && parts.length === 1) return hostsView(v);
    if (parts[0] === 'runs' && parts.length === 2) return runView(v, decodeURIComponent(parts[1]));
    return runsView(v, new URLSearchParams(query || ''));
  }

  function signOut(err) {
    sessionStorage.removeItem(TOKEN_KEY);
    $('whoami').textContent = '';
    const v = enterView();
    $('nav').hidden = true;
    $('signout').hidden = true;
    signInView(v, err ? (err.code ? `${err.message} (${err.code})` : err.message) : 'Signed out.');
  }

  function mount(...nodes) { $('view').replaceChildren(...nodes); }

  // ---- sign in

  function signInView(v, message) {
    const input = el('input', withId('signin-token', {
      type: 'password', name: 'token', autocomplete: 'off', spellcheck: 'false', required: true, placeholder: 'rft_...',
    }));
    const msg = el('p', withId('signin-message', { class: 'message', role: 'status', text: message || '' }));
    const form = el('form', withId('signin-form', { class: 'signin' }),
      el('h1', { text: 'Sign in' }),
      el('p', { text: 'Paste a caller token (or the admin token). It is kept in this tab only and sent to Fleet alone.' }),
      el('label', { for: 'signin-token', text: 'Token' }), input,
      el('button', withId('signin-submit', { type: 'submit', text: 'Sign in' })), msg);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      msg.textContent = 'Checking...';
      try {
        const { body } = await call('GET', '/fleet/hosts', { token, signal: v.ctl.signal });
        sessionStorage.setItem(TOKEN_KEY, token);
        noteAdmin(body.hosts);
        route();
      } catch (err) {
        if (err.name !== 'AbortError') msg.textContent = err.code ? `${err.message} (${err.code})` : err.message;
      }
    });
    mount(form);
    input.focus();
  }

  // An admin's view of a host carries its credentialRef; no other caller's
  // does. With no host to tell by, the buttons an admin lacks cost nothing:
  // an admin route answers 403 admin_required, shown as it is.
  function noteAdmin(hosts) {
    const admin = (hosts || []).some((h) => 'credentialRef' in h);
    $('whoami').textContent = admin ? 'signed in (admin)' : 'signed in';
    return admin;
  }

  // ---- hosts

  function hostsView(v) {
    const tbody = el('tbody');
    const table = el('table', withId('hosts-table'), el('thead', {}, el('tr', {},
      ...['Host', 'State', 'Probe', 'Agents', 'Load', 'Storage', 'Version', 'Probed', ''].map((h) => el('th', { text: h })))), tbody);
    const refresh = el('button', withId('hosts-refresh', { type: 'button', text: 'Refresh' }));
    mount(el('div', { class: 'head' }, el('h1', { text: 'Hosts' }), refresh), table);

    async function load() {
      try {
        const { body } = await call('GET', '/fleet/hosts', { signal: v.ctl.signal });
        const admin = noteAdmin(body.hosts);
        tbody.replaceChildren(...body.hosts.map((h) => hostRow(h, admin)));
        if (!body.hosts.length) tbody.append(el('tr', {}, el('td', { colspan: 9, class: 'empty', text: 'No host is visible to this token.' })));
      } catch (err) { showError(err); }
    }
    function hostRow(h, admin) {
      const p = h.probe;
      const draining = !!(p && p.draining);
      const state = !h.enabled ? 'disabled' : draining ? 'draining' : 'enabled';
      const cell = (col, ...c) => el('td', { 'data-col': col }, ...c);
      const actions = el('td', { 'data-col': 'actions' });
      if (admin) {
        const button = (action, label) => {
          const b = el('button', { type: 'button', 'data-action': action, text: label });
          b.addEventListener('click', () => hostVerb(h.id, action, b));
          return b;
        };
        actions.append(draining ? button('resume', 'Resume') : button('drain', 'Drain'), button('probe', 'Probe'));
      }
      return el('tr', { 'data-host-id': h.id },
        cell('id', el('code', { text: h.id })),
        cell('state', el('span', { class: 'status h-' + state, text: state })),
        cell('probe', p ? el('span', { class: 'status p-' + p.status, title: p.detail || '', text: p.status + (p.detail ? ': ' + p.detail : '') }) : 'never probed'),
        cell('agents', p ? p.agents.join(', ') : ''),
        cell('load', p && p.load ? `${p.load.active}/${p.load.maxConcurrent}` : ''),
        cell('storage', p && p.storage ? bytes(p.storage.freeBytes) + ' free' + (p.storage.low ? ' (low)' : '') : ''),
        cell('version', p && p.version ? p.version : ''),
        cell('probed', p ? ageCell(p.at) : ''),
        actions);
    }
    async function hostVerb(id, action, button) {
      button.disabled = true;
      try {
        const { status, body } = await call('POST', '/fleet/hosts' + pathOf(id) + '/' + action, { signal: v.ctl.signal });
        await load();
        if (status === 202) showNotice(`${action} of ${id}: the host did not confirm (${body.detail || 'outcome unknown'})`);
      } catch (err) {
        showError(err);
        await load();
      }
    }
    refresh.addEventListener('click', load);
    load();
  }

  // ---- runs

  function runsView(v, q) {
    const filters = { status: q.get('status') || '', agent: q.get('agent') || '', host: q.get('host') || '' };
    const status = el('select', withId('filter-status', { name: 'status' }),
      el('option', { value: '', text: 'any status' }),
      ...STATUSES.map((s) => el('option', { value: s, text: s, selected: s === filters.status })));
    const agent = el('input', withId('filter-agent', { name: 'agent', placeholder: 'agent', value: filters.agent }));
    const host = el('input', withId('filter-host', { name: 'host', placeholder: 'host', value: filters.host }));
    const form = el('form', withId('runs-filter', { class: 'filters' }), status, agent, host,
      el('button', withId('filter-apply', { type: 'submit', text: 'Filter' })));
    const refresh = el('button', withId('runs-refresh', { type: 'button', text: 'Refresh' }));
    const tbody = el('tbody');
    const table = el('table', withId('runs-table'), el('thead', {}, el('tr', {},
      ...['Run', 'Status', 'Host', 'Agent', 'Repository', 'Owner', 'Created', 'Ended'].map((h) => el('th', { text: h })))), tbody);
    const empty = el('p', withId('runs-empty', { class: 'empty', hidden: true, text: 'No run matches.' }));
    const older = el('button', withId('runs-older', { type: 'button', hidden: true, text: 'Older' }));
    mount(el('div', { class: 'head' }, el('h1', { text: 'Runs' }), refresh), form, table, empty, older);

    form.addEventListener('submit', (e) => {
      e.preventDefault();
      const p = new URLSearchParams();
      for (const [k, input] of [['status', status], ['agent', agent], ['host', host]]) {
        if (input.value.trim()) p.set(k, input.value.trim());
      }
      const hash = '#/runs' + (p.toString() ? '?' + p : '');
      if (location.hash === hash) route(); else location.hash = hash;
    });

    let cursor = '';
    let paged = false;
    async function load(more) {
      const p = new URLSearchParams();
      for (const [k, val] of Object.entries(filters)) if (val) p.set(k, val);
      if (more) p.set('cursor', cursor);
      try {
        const { body } = await call('GET', '/fleet/runs' + (p.toString() ? '?' + p : ''), { signal: v.ctl.signal });
        const rows = body.runs.map(runRow);
        if (more) tbody.append(...rows); else tbody.replaceChildren(...rows);
        if (more) paged = true;
        cursor = body.nextCursor || '';
        older.hidden = !cursor;
        empty.hidden = tbody.children.length > 0;
      } catch (err) { showError(err); }
    }
    function runRow(r) {
      const cell = (col, ...c) => el('td', { 'data-col': col }, ...c);
      const link = el('a', { href: '#/runs/' + encodeURIComponent(r.fleetRunId) }, el('code', { text: r.fleetRunId }));
      return el('tr', { 'data-run-id': r.fleetRunId },
        cell('id', link), cell('status', statusBadge(r.status), waiting(r) ? ' ' : null, waiting(r) ? queuePlace(r.queue) : null),
        cell('host', r.hostId), cell('agent', r.agent),
        cell('repository', r.repository || ''), cell('owner', r.ownerId), cell('created', ageCell(r.createdAt)),
        cell('ended', r.endedAt ? ageCell(r.endedAt) : ''));
    }
    refresh.addEventListener('click', () => { paged = false; load(false); });
    older.addEventListener('click', () => load(true));
    // The first page refreshes itself while it is the only one shown and
    // the tab is visible; an older page stays as it was read.
    v.timers.push(setInterval(() => { if (!paged && !document.hidden) load(false); }, RUNS_REFRESH_MS));
    load(false);
  }

  // ---- a run

  function runView(v, id) {
    const fields = {};
    const labels = {};
    const dl = el('dl', withId('run-state', { hidden: true }));
    for (const [name, label] of [['status', 'Status'], ['exitCode', 'Exit code'], ['reason', 'Reason'], ['detail', 'Detail'],
      ['hostId', 'Host'], ['queue', 'Queue'], ['agent', 'Agent'], ['repository', 'Repository'], ['attempt', 'Attempt'], ['ownerId', 'Owner'],
      ['createdAt', 'Created'], ['updatedAt', 'Updated'], ['endedAt', 'Ended'], ['credentials', 'Credentials'], ['note', 'Note']]) {
      fields[name] = el('dd', { 'data-field': name });
      labels[name] = el('dt', { text: label });
      dl.append(labels[name], fields[name]);
    }
    const cancel = el('button', withId('run-cancel', { type: 'button', text: 'Cancel' }));
    const retry = el('button', withId('run-retry', { type: 'button', text: 'Retry' }));
    const streamState = el('span', withId('run-stream-state', { class: 'stream-state' }));
    const output = el('pre', withId('run-output', { class: 'output', tabindex: 0 }));
    const trimmed = el('p', withId('run-output-trimmed', { class: 'message', hidden: true, text: 'Earlier output was trimmed from this page.' }));
    const events = el('ol', withId('run-events', { class: 'events' }));
    const egressSummary = el('div', withId('egress-summary', { class: 'summary' }));
    const egressBody = el('tbody');
    const egressTable = el('table', withId('egress-table'), el('thead', {}, el('tr', {},
      ...['#', 'Time', 'Via', 'Authority', 'Method', 'Path', 'Status', 'Action', 'Reason', 'Alert'].map((h) => el('th', { text: h })))), egressBody);
    const egressEmpty = el('p', withId('egress-empty', { class: 'empty', hidden: true, text: 'No egress recorded.' }));
    const egressMore = el('button', withId('egress-more', { type: 'button', hidden: true, text: 'More records' }));
    const egressReload = el('button', withId('egress-reload', { type: 'button', text: 'Reload' }));
    mount(el('section', withId('run-page', { 'data-run-id': id }),
      el('p', {}, el('a', { href: '#/runs', text: '\u2190 Runs' })),
      el('div', { class: 'head' }, el('h1', {}, 'Run ', el('code', { text: id })), el('span', { class: 'actions' }, cancel, retry)),
      dl,
      el('div', { class: 'head' }, el('h2', { text: 'Output' }), streamState), output, trimmed,
      el('h2', { text: 'Events' }), events,
      el('div', { class: 'head' }, el('h2', { text: 'Egress' }), egressReload), egressSummary, egressTable, egressEmpty, egressMore));

    let run = null;
    let following = false;
    const term = new Terminal(output, trimmed);
    let lastSeq = 0;

    function showRun(r, note) {
      run = r;
      dl.hidden = false;
      for (const [name, dd] of Object.entries(fields)) {
        const val = name === 'note' ? note : r[name];
        if (name === 'status') dd.replaceChildren(statusBadge(r.status, 'run-status'));
        else if (name === 'queue') dd.replaceChildren(...queueParts(val, r));
        else if (/At$/.test(name)) dd.replaceChildren(time(val));
        // A brokered key: what minted it and the life of the value its
        // host holds (the API never gives a value).
        else if (name === 'credentials') dd.replaceChildren(...(val || []).map((c) => el('div', { 'data-credential': c.projectId + '/' + c.key },
          c.projectId + '/' + c.key + ' (' + c.kind + '), expires ', time(c.expiresAt), c.revokedAt ? ', revoked ' : null, c.revokedAt ? time(c.revokedAt) : null)));
        else dd.textContent = val === undefined || val === null ? '' : String(val);
        // A field the run lacks (no reason yet, no repository) is left out.
        dd.hidden = labels[name].hidden = dd.textContent === '';
      }
      cancel.disabled = TERMINAL.has(r.status);
      retry.disabled = !TERMINAL.has(r.status);
    }
    // A state event's data ({status, attempt, exitCode?, reason?,
    // detail?}) or a done message's: the run as it stands now.
    function showState(s) {
      if (!run || !s || !s.status) return;
      const r = Object.assign({}, run, { status: s.status });
      for (const k of ['attempt', 'exitCode', 'reason', 'detail']) if (k in s) r[k] = s[k];
      const left = waiting(run) && !waiting(r);
      showRun(r, '');
      // A run that left the queue has a host and a wait to show: read it.
      if (left) loadRun().catch(showError);
    }
    function setStream(state, text) {
      streamState.dataset.state = state;
      streamState.textContent = text || state;
    }

    function onEvent(ev) {
      if (ev.sequence <= lastSeq) return; // a resumed stream repeats nothing, but the page checks
      lastSeq = ev.sequence;
      if (ev.type === 'output') {
        term.write(typeof ev.data === 'string' ? ev.data : JSON.stringify(ev.data));
        return;
      }
      if (ev.type === 'state') showState(ev.data);
      events.append(el('li', { 'data-seq': ev.sequence, 'data-type': ev.type },
        el('span', { class: 'seq', text: '#' + ev.sequence }), ' ', time(ev.ts), ' ',
        el('strong', { text: ev.type }), ' ', el('code', { text: JSON.stringify(ev.data) })));
    }

    async function loadRun() {
      const { body } = await call('GET', '/fleet/runs' + pathOf(id), { signal: v.ctl.signal });
      showRun(body.run, body.note || '');
      return body.run;
    }

    function startFollowing() {
      if (following || !run) return;
      following = true;
      follow(run.links.stream, {
        signal: v.ctl.signal,
        state: setStream,
        message(m) {
          let data;
          try { data = JSON.parse(m.data); } catch (_) { return; }
          if (m.event === 'event') onEvent(data);
          else if (m.event === 'snapshot') showState(data);
          else if (m.event === 'done') showState(data);
        },
      }).then(async (how) => {
        following = false;
        if (how !== 'done') return;
        try { await loadRun(); await loadEgress(false); } catch (err) { showError(err); }
      });
    }

    let egressCursor = null;
    async function loadEgress(more) {
      if (!run) return;
      if (!more) { egressCursor = null; egressBody.replaceChildren(); }
      let page;
      // At most five pages a click: a ledger can hold many records.
      for (let i = 0; i < 5; i++) {
        const u = new URL(run.links.egress, location.href);
        u.searchParams.set('limit', '200');
        if (egressCursor !== null) u.searchParams.set('cursor', String(egressCursor));
        ({ body: page } = await call('GET', u.toString(), { signal: v.ctl.signal }));
        egressBody.append(...page.records.map(egressRow));
        if (page.nextCursor !== undefined) egressCursor = page.nextCursor;
        if (!page.hasMore) break;
      }
      egressSummary.replaceChildren(...summaryOf(page.summary || run.egress, page.seal, page.live));
      egressEmpty.hidden = egressBody.children.length > 0;
      egressTable.hidden = !egressEmpty.hidden;
      egressMore.hidden = !page.hasMore;
    }
    function egressRow(r) {
      const c = (col, v) => el('td', { 'data-col': col, text: v === undefined || v === null ? '' : String(v) });
      return el('tr', { 'data-egress-seq': r.seq, class: r.alert ? 'alert' : false },
        c('seq', r.seq), el('td', { 'data-col': 'ts' }, time(r.ts)), c('via', r.via), c('authority', r.authority),
        c('method', r.method), c('path', r.path || r.command), c('status', r.status || ''), c('action', r.action),
        c('reason', r.reason), c('alert', r.alert));
    }
    function summaryOf(s, seal, live) {
      if (!s) return [el('p', { class: 'empty', text: 'No egress ledger mirrored yet.' })];
      const out = [el('p', {}, `${count(s.requests, 'request')}, ${s.blocked} blocked, ${s.warned} warned, ${count(s.alerts, 'alert')}, ` +
        `${bytes(s.bytesUp)} up, ${bytes(s.bytesDown)} down` + (s.dropped ? `, ${s.dropped} dropped` : '') +
        (seal ? `; sealed at ${count(seal.count, 'record')}` : live ? '; still recording' : '; not sealed'))];
      if (s.authorities.length) {
        out.push(el('ul', { class: 'authorities' }, ...s.authorities.map((a) => el('li', {},
          el('code', { text: a.authority }), ` ${count(a.requests, 'request')}, ${a.blocked} blocked` + (a.keys.length ? '; keys ' + a.keys.join(', ') : '')))));
      }
      if (s.otherAuthorities) out.push(el('p', { text: `and ${count(s.otherAuthorities, 'request')} to other authorities` }));
      return out;
    }

    async function verb(name) {
      try {
        const { status, body } = await call('POST', run.links.self + '/' + name, { signal: v.ctl.signal });
        showRun(body.run, '');
        if (status === 202) showNotice(`${name}: the host did not confirm (${body.detail || 'outcome unknown'})`);
        if (name === 'retry') startFollowing();
      } catch (err) {
        showError(err);
        if (err.body && err.body.run) showRun(err.body.run, '');
      }
    }
    cancel.addEventListener('click', () => verb('cancel'));
    retry.addEventListener('click', () => verb('retry'));
    egressReload.addEventListener('click', () => loadEgress(false).catch(showError));
    egressMore.addEventListener('click', () => loadEgress(true).catch(showError));

    setStream('connecting');
    loadRun().then(() => {
      startFollowing();
      return loadEgress(false);
    }).catch((err) => { setStream('error', 'not following'); showError(err); });
  }

  // ---- the stream

  // follow reads a run's Server-Sent Events with fetch (EventSource cannot
  // send the bearer header) until `event: done`, resuming with
  // Last-Event-ID after a planned end (a retry: hint, then the end), an
  // idle end or a dropped connection. It resolves "done", or "stopped"
  // (the page left, a refusal other than a fault or a 429).
  async function follow(url, h) {
    const parser = new SSEParser();
    let failures = 0;
    for (;;) {
      if (h.signal.aborted) return 'stopped';
      h.state('connecting');
      let wait;
      try {
        const headers = { Authorization: 'Bearer ' + getToken(), Accept: 'text/event-stream' };
        if (parser.lastEventId) headers['Last-Event-ID'] = parser.lastEventId;
        const resp = await fetch(url, { headers, signal: h.signal, cache: 'no-store', credentials: 'omit' });
        if (!resp.ok) {
          let body = null;
          try { body = await resp.json(); } catch (_) { /* not JSON */ }
          const err = new ApiError(resp.status, body);
          if (resp.status === 401) { signOut(err); return 'stopped'; }
          if (resp.status !== 429 && resp.status < 500) { h.state('error', 'not following'); showError(err); return 'stopped'; }
          h.state('waiting', err.message);
          wait = resp.status === 429 && body && body.details ? body.details.retryAfterSeconds * 1000 : backoff(failures++);
        } else {
          h.state('live');
          const how = await readStream(resp.body, parser, (m) => {
            failures = 0;
            h.message(m);
            return m.event === 'done';
          });
          if (how === 'done') { h.state('done'); return 'done'; }
          // A planned or idle end gave a retry: hint before ending; anything
          // else dropped the connection: back off.
          wait = parser.sawRetry ? parser.retry : backoff(failures++);
          h.state('waiting', `reconnecting in ${Math.round(wait / 1000)}s`);
        }
      } catch (err) {
        if (h.signal.aborted) return 'stopped';
        wait = backoff(failures++);
        h.state('waiting', `connection lost; reconnecting in ${Math.round(wait / 1000)}s`);
      }
      await sleep(wait, h.signal);
    }
  }
  const backoff = (n) => Math.min(30000, 1000 * 2 ** n);
  const sleep = (ms, signal) => new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });

  async function readStream(body, parser, onMessage) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    parser.reset();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return 'ended';
        for (const m of parser.feed(decoder.decode(value, { stream: true }))) {
          if (onMessage(m)) return 'done';
        }
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  // SSEParser is the HTML standard's event-stream interpretation: lines
  // ended by CRLF, LF or CR; "field: value"; data lines joined by "\n"; a
  // blank line dispatches; the last event id kept across connections.
  class SSEParser {
    constructor() { this.lastEventId = ''; this.retry = 3000; this.reset(); }
    reset() { this.buf = ''; this.data = []; this.event = ''; this.idBuf = this.lastEventId; this.sawRetry = false; }
    feed(chunk) {
      this.buf += chunk;
      const out = [];
      const re = /\r\n|\r|\n/g;
      let start = 0;
      let m;
      while ((m = re.exec(this.buf)) !== null) {
        if (m[0] === '\r' && m.index === this.buf.length - 1) break; // maybe CRLF cut in two
        this.line(this.buf.slice(start, m.index), out);
        start = re.lastIndex;
      }
      this.buf = this.buf.slice(start);
      return out;
    }
    line(l, out) {
      if (l === '') {
        this.lastEventId = this.idBuf;
        if (this.data.length) out.push({ event: this.event || 'message', data: this.data.join('\n'), id: this.lastEventId });
        this.data = [];
        this.event = '';
        return;
      }
      if (l[0] === ':') return;
      const c = l.indexOf(':');
      const name = c < 0 ? l : l.slice(0, c);
      let value = c < 0 ? '' : l.slice(c + 1);
      if (value[0] === ' ') value = value.slice(1);
      if (name === 'event') this.event = value;
      else if (name === 'data') this.data.push(value);
      else if (name === 'id' && !value.includes('\0')) this.idBuf = value;
      else if (name === 'retry' && /^\d+$/.test(value)) { this.retry = Number(value); this.sawRetry = true; }
    }
  }

  // ---- output: text, with SGR colours as classes

  // Terminal appends a run's output to a <pre> as text nodes (spans with a
  // class for SGR styles). Other escape sequences are dropped; any other
  // control character is shown as its Unicode control picture. A sequence
  // or a CR cut between two output events is held until the next.
  class Terminal {
    constructor(pre, trimmedNote) {
      this.pre = pre;
      this.note = trimmedNote;
      this.carry = '';
      this.style = { fg: -1, bg: -1, b: false, d: false, i: false, u: false };
      this.size = 0;
    }
    write(text) {
      text = this.carry + text;
      this.carry = '';
      const tail = /\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[ -/]*)$|\r$/.exec(text);
      if (tail && tail[0].length < 256) {
        this.carry = tail[0];
        text = text.slice(0, tail.index);
      }
      const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
      const re = /\x1b\[([0-?]*)[ -/]*([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -/]*[0-~]/g;
      let last = 0;
      let m;
      while ((m = re.exec(text)) !== null) {
        this.emit(text.slice(last, m.index));
        if (m[2] === 'm') this.sgr(m[1]);
        last = re.lastIndex;
      }
      this.emit(text.slice(last));
      this.trim();
      if (atBottom) this.pre.scrollTop = this.pre.scrollHeight;
    }
    emit(s) {
      if (!s) return;
      s = s.replace(/\r\n?/g, '\n').replace(/[\x00-\x08\x0b-\x1f\x7f]/g, (c) => String.fromCharCode(c === '\x7f' ? 0x2421 : 0x2400 + c.charCodeAt(0)));
      const st = this.style;
      const cls = [st.fg >= 0 && 'fg' + st.fg, st.bg >= 0 && 'bg' + st.bg, st.b && 'b', st.d && 'd', st.i && 'i', st.u && 'u'].filter(Boolean).join(' ');
      const lastNode = this.pre.lastChild;
      // Nodes grow to a bound only, so trimming drops old output, not all.
      const small = lastNode && lastNode.textContent.length < 8192;
      if (!cls && small && lastNode.nodeType === Node.TEXT_NODE) lastNode.appendData(s);
      else if (cls && small && lastNode.nodeType === Node.ELEMENT_NODE && lastNode.className === cls) lastNode.firstChild.appendData(s);
      else this.pre.append(cls ? el('span', { class: cls }, s) : document.createTextNode(s));
      this.size += s.length;
    }
    sgr(params) {
      const st = this.style;
      const ps = params === '' ? [0] : params.split(';').map((p) => Number(p) || 0);
      for (let i = 0; i < ps.length; i++) {
        const p = ps[i];
        if (p === 0) Object.assign(st, { fg: -1, bg: -1, b: false, d: false, i: false, u: false });
        else if (p === 1) st.b = true;
        else if (p === 2) st.d = true;
        else if (p === 3) st.i = true;
        else if (p === 4) st.u = true;
        else if (p === 22) st.b = st.d = false;
        else if (p === 23) st.i = false;
        else if (p === 24) st.u = false;
        else if (p >= 30 && p <= 37) st.fg = p - 30;
        else if (p === 39) st.fg = -1;
        else if (p >= 40 && p <= 47) st.bg = p - 40;
        else if (p === 49) st.bg = -1;
        else if (p >= 90 && p <= 97) st.fg = p - 90 + 8;
        else if (p >= 100 && p <= 107) st.bg = p - 100 + 8;
        else if (p === 38 || p === 48) {
          // 256 colours: the first 16 map to classes, the rest show plain;
          // true colour is skipped.
          const key = p === 38 ? 'fg' : 'bg';
          if (ps[i + 1] === 5) { st[key] = ps[i + 2] < 16 ? ps[i + 2] : -1; i += 2; } else if (ps[i + 1] === 2) i += 4;
        }
      }
    }
    trim() {
      if (this.size <= OUTPUT_MAX_CHARS) return;
      while (this.size > OUTPUT_MAX_CHARS * 0.8 && this.pre.firstChild) {
        this.size -= this.pre.firstChild.textContent.length;
        this.pre.firstChild.remove();
      }
      this.note.hidden = false;
    }
  }

  $('signout').addEventListener('click', () => signOut(null));
  window.addEventListener('hashchange', route);
  route();
})();
