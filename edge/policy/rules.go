package policy

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/runfleet/runfleet/edge/config"
)

// Request rules (issue 31 item 4): a key's ordered allow and deny rules on
// the method and path of the HTTPS requests that carry it, the first that
// matches deciding, a request none matches going by the key's default.
// They govern only requests that carry the key: one without it holds no
// credential of the key's.
//
// How a path is read, so that a deny cannot be slipped past by writing
// the same path another way (the decision reads the path the task sent,
// which is what edge forwards):
//   - split on "/" into segments, a single trailing "/" ignored (most
//     servers route "/a/" as "/a");
//   - each segment percent-decoded, then compared with the pattern's
//     case-insensitively (ASCII), so a case-insensitive upstream (GitHub's
//     repository names) cannot be reached past a deny by changing case;
//   - refused outright, for a key whose rules name paths, when an upstream
//     could read the path as another one: a dot segment ("." or ".."), an
//     empty segment ("//"), a percent-encoded "/", "." or "\" (servers
//     disagree on decoding them before routing), a "\" or ";" (Windows
//     servers read "\" as "/"; Java servers cut a segment at ";"), a
//     double percent-encoding ("%2541"), a control byte or invalid UTF-8
//     once decoded, and the two non-ASCII letters whose Unicode case
//     folding is ASCII (the Kelvin sign and the long s).
//
// Methods are compared in upper case, and a method an upstream may take
// instead of the request's own (X-HTTP-Method-Override, X-HTTP-Method,
// X-Method-Override, a _method query parameter: Google's APIs, Symfony,
// Laravel) is decided as well: the request goes only if every one of them
// is allowed. A _method field in a form body is not read.

// Rule actions, modes and defaults as edge.json writes them.
const (
	RuleAllow   = "allow"
	RuleDeny    = "deny"
	ModeEnforce = "enforce"
	ModeWarn    = "warn"
)

// Rules are a key's compiled request rules. Nil means none: every request
// the key may reach goes.
type Rules struct {
	// Name is the key's place, "projects.<p>.keys.<KEY>" (config.Path's
	// form without "policy."): each rule is named Name+".rules[i]", the
	// default Name+".default", as audit lines name them.
	Name string
	List []Rule
	// DefaultAllow decides a request no rule matches.
	DefaultAllow bool
	// Warn lets a request the rules refuse go, decided Warn.
	Warn bool
	// namesPaths: some rule names paths, so a path must read one way.
	namesPaths  bool
	defaultName string
}

// Rule is one compiled rule.
type Rule struct {
	Allow bool
	// Methods are upper case; nil matches any method.
	Methods []string
	// Paths: nil matches any path.
	Paths []PathPattern
	// Name is "projects.<p>.keys.<KEY>.rules[i]".
	Name string
	// Text is the rule as an operator reads it: "deny POST /**/git-receive-pack".
	Text string
}

// PathPattern is one of a rule's path patterns, as written and as matched.
type PathPattern struct {
	Text string
	// segments are decoded and lower case; "*" and "**" are wildcards.
	segments []string
}

// anyPath is the pattern a rule without paths stands for.
var anyPath = PathPattern{Text: "/**", segments: []string{"**"}}

// CompilePathPattern reads a path pattern: it starts with "/", its
// segments are read as a request's are (and refused for what a request's
// would be), "*" stands for one whole segment and "**" for any number of
// them, none included.
func CompilePathPattern(text string) (PathPattern, error) {
	switch {
	case !strings.HasPrefix(text, "/"):
		return PathPattern{}, fmt.Errorf(`a path pattern starts with "/"`)
	case strings.ContainsAny(text, "?#"):
		return PathPattern{}, fmt.Errorf("a path pattern has no query or fragment: rules match the path alone")
	case len(text) > 1 && strings.HasSuffix(text, "/") && !strings.HasSuffix(text, "//"):
		return PathPattern{}, fmt.Errorf(`a path pattern does not end in "/": a request's trailing "/" is ignored, so write %q`, strings.TrimSuffix(text, "/"))
	}
	segs, why := splitPath(text)
	if why != "" {
		return PathPattern{}, fmt.Errorf("%s", why)
	}
	for _, s := range segs {
		if strings.Contains(s, "*") && s != "*" && s != "**" {
			return PathPattern{}, fmt.Errorf(`"*" and "**" stand only for whole segments, not %q`, s)
		}
	}
	return PathPattern{Text: text, segments: segs}, nil
}

// match reports whether the pattern matches a path's segments (splitPath).
// It backtracks only to the last "**", so it takes at most
// len(pattern)*len(path) steps whatever a task sends.
func (p PathPattern) match(path []string) bool {
	pat := p.segments
	i, j := 0, 0
	star, mark := -1, 0
	for j < len(path) {
		switch {
		case i < len(pat) && pat[i] == "**":
			star, mark = i, j
			i++
		case i < len(pat) && (pat[i] == "*" || pat[i] == path[j]):
			i++
			j++
		case star >= 0:
			i = star + 1
			mark++
			j = mark
		default:
			return false
		}
	}
	for i < len(pat) && pat[i] == "**" {
		i++
	}
	return i == len(pat)
}

// covers reports whether p matches every path q matches. It reads q's
// wildcards as symbols p must cover ("*" by "*" or "**", "**" by "**"),
// which is sound (true only when every path of q's is p's) though it may
// miss an equivalence written another way ("/*/**" and "/**/*").
func (p PathPattern) covers(q PathPattern) bool {
	a, b := p.segments, q.segments
	// ok[i][j]: a[i:] covers b[j:].
	ok := make([][]bool, len(a)+1)
	for i := range ok {
		ok[i] = make([]bool, len(b)+1)
	}
	ok[len(a)][len(b)] = true
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b); j >= 0; j-- {
			switch {
			case a[i] == "**":
				ok[i][j] = ok[i+1][j] || (j < len(b) && ok[i][j+1])
			case j == len(b) || b[j] == "**":
			case a[i] == "*":
				ok[i][j] = ok[i+1][j+1]
			default:
				ok[i][j] = a[i] == b[j] && ok[i+1][j+1]
			}
		}
	}
	return ok[0][0]
}

// Reasons a path is ambiguous (splitPath).
const (
	pathNotAPath       = `it is not a path (it does not start with "/")`
	pathEmptySegment   = `it has an empty segment ("//")`
	pathDotSegment     = `it has a dot segment ("." or "..")`
	pathEncodedSep     = `it has a percent-encoded "/", "." or "\"`
	pathBackslash      = `it has a "\"`
	pathSemicolon      = `it has a ";"`
	pathBadEscape      = "it has a malformed percent-encoding"
	pathDoubleEncoding = `it is percent-encoded twice ("%25" before two hex digits)`
	pathControl        = "it has a control byte once decoded"
	pathNotUTF8        = "it is not UTF-8 once decoded"
	pathFoldsToASCII   = "it has a letter whose Unicode case folding is ASCII (the Kelvin sign or the long s)"
)

// splitPath reads an escaped path into its segments, decoded and in lower
// case (ASCII), "/" having none; why says what makes it ambiguous, "" when
// nothing does.
func splitPath(p string) (segs []string, why string) {
	if p == "" || p[0] != '/' {
		return nil, pathNotAPath
	}
	if len(p) > 1 && p[len(p)-1] == '/' && p[len(p)-2] != '/' {
		p = p[:len(p)-1]
	}
	if p == "/" {
		return nil, ""
	}
	rest := p[1:]
	segs = make([]string, 0, strings.Count(rest, "/")+1)
	for {
		raw, next, more := strings.Cut(rest, "/")
		s, why := decodeSegment(raw)
		if why != "" {
			return nil, why
		}
		segs = append(segs, s)
		if !more {
			return segs, ""
		}
		rest = next
	}
}

// decodeSegment percent-decodes one segment and lower-cases it (ASCII),
// or says why it is ambiguous.
func decodeSegment(raw string) (string, string) {
	if raw == "" {
		return "", pathEmptySegment
	}
	var b []byte
	for i := 0; i < len(raw); i++ {
		start, c, changed := i, raw[i], false
		switch c {
		case '\\':
			return "", pathBackslash
		case ';':
			return "", pathSemicolon
		case '%':
			if i+2 >= len(raw) || !isHex(raw[i+1]) || !isHex(raw[i+2]) {
				return "", pathBadEscape
			}
			c = unhex(raw[i+1])<<4 | unhex(raw[i+2])
			if c == '/' || c == '.' || c == '\\' {
				return "", pathEncodedSep
			}
			i += 2
			changed = true
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
			changed = true
		}
		if changed && b == nil {
			b = append(make([]byte, 0, len(raw)), raw[:start]...)
		}
		if b != nil {
			b = append(b, c)
		}
	}
	s := raw
	if b != nil {
		s = string(b)
	}
	switch {
	case s == "." || s == "..":
		return "", pathDotSegment
	case !utf8.ValidString(s):
		return "", pathNotUTF8
	case strings.ContainsRune(s, '\u212a') || strings.ContainsRune(s, '\u017f'):
		return "", pathFoldsToASCII
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < ' ' || c == 0x7f:
			return "", pathControl
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			return "", pathDoubleEncoding
		}
	}
	return s, ""
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// upperASCII is s in upper case (ASCII), s itself when it is already.
func upperASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'a' <= b[j] && b[j] <= 'z' {
					b[j] -= 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// RequestInput is what a key's rules read of a request, as the task sent
// it (before anything in it is substituted).
type RequestInput struct {
	Method string
	// Overrides are the methods the request names for an upstream to take
	// instead of Method: X-HTTP-Method-Override, X-HTTP-Method,
	// X-Method-Override and _method query parameter values.
	Overrides []string
	// Path is the escaped path (url.URL.EscapedPath, "/" for none), the
	// form edge forwards; "" when the target is not a path.
	Path string
}

// RequestDecision is the rules' decision on a request. Reason never
// quotes the request: it names the rule and what the rule says.
type RequestDecision struct {
	// Allow: the request may go. It is false only in enforce mode.
	Allow bool
	// Warn: the rules would refuse the request, and warn mode lets it go.
	Warn bool
	// Rule names what decided: Rules.Name+".rules[i]" or ".default", or
	// Rules.Name+".rules" for a path refused as ambiguous; "" without
	// rules.
	Rule   string
	Reason string
}

// DecideRequest decides a request that carries the key of rs by its
// rules: the first rule matching its method and path decides, its
// default when none does; every method it names (Overrides) must be
// allowed too. A key whose rules name paths refuses a path an upstream
// could read as another (splitPath). In warn mode what would be refused
// goes, with Warn set.
func DecideRequest(rs *Rules, in RequestInput) RequestDecision {
	if rs == nil {
		return RequestDecision{Allow: true}
	}
	var segs []string
	if rs.namesPaths {
		var why string
		if segs, why = splitPath(in.Path); why != "" {
			return rs.refuse(rs.Name+".rules", fmt.Sprintf("%s.rules name paths, and the request's path is ambiguous: %s, which an upstream may read as another path", rs.Name, why))
		}
	}
	i := rs.first(upperASCII(in.Method), segs)
	if !rs.allows(i) {
		return rs.refuse(rs.ruleName(i), rs.matched(i, "the request"))
	}
	for _, m := range in.Overrides {
		if j := rs.first(upperASCII(strings.TrimSpace(m)), segs); !rs.allows(j) {
			return rs.refuse(rs.ruleName(j), rs.matched(j, "the method the request names for the upstream to take instead (X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override or a _method parameter)"))
		}
	}
	return RequestDecision{Allow: true, Rule: rs.ruleName(i)}
}

// String is the rules as an operator reads them, in order: "enforce:
// deny POST /**/git-receive-pack; else allow".
func (rs *Rules) String() string {
	mode := ModeEnforce
	if rs.Warn {
		mode = ModeWarn
	}
	parts := make([]string, 0, len(rs.List)+1)
	for _, r := range rs.List {
		parts = append(parts, r.Text)
	}
	dflt := RuleAllow
	if !rs.DefaultAllow {
		dflt = RuleDeny
	}
	return mode + ": " + strings.Join(append(parts, "else "+dflt), "; ")
}

// first is the index of the first rule matching method and path, -1 for
// none.
func (rs *Rules) first(method string, path []string) int {
	for i := range rs.List {
		if rs.List[i].matches(method, path) {
			return i
		}
	}
	return -1
}

func (r *Rule) matches(method string, path []string) bool {
	if r.Methods != nil && !slices.Contains(r.Methods, method) {
		return false
	}
	return r.Paths == nil || slices.ContainsFunc(r.Paths, func(p PathPattern) bool { return p.match(path) })
}

func (rs *Rules) allows(i int) bool {
	if i < 0 {
		return rs.DefaultAllow
	}
	return rs.List[i].Allow
}

func (rs *Rules) ruleName(i int) string {
	if i < 0 {
		return rs.defaultName
	}
	return rs.List[i].Name
}

func (rs *Rules) matched(i int, what string) string {
	if i < 0 {
		return fmt.Sprintf("no rule of %s matches %s, and %s is deny", rs.Name, what, rs.defaultName)
	}
	return fmt.Sprintf("%s (%s) matches %s", rs.List[i].Name, rs.List[i].Text, what)
}

func (rs *Rules) refuse(rule, reason string) RequestDecision {
	return RequestDecision{Allow: rs.Warn, Warn: rs.Warn, Rule: rule, Reason: reason}
}

// compileRules checks a key's rules, default and mode; nil when the key
// has none that could refuse anything. Kind ssh has none: checked by
// compileSSH.
func compileRules(at config.Path, kp config.KeyPolicy) (*Rules, config.Problems) {
	var ps config.Problems
	rs := &Rules{Name: config.Path(at[1:]).String(), DefaultAllow: kp.Default != RuleDeny, Warn: kp.Mode == ModeWarn}
	rs.defaultName = rs.Name + ".default"
	// usable[i]: rule i compiled and may match something, so whether
	// another covers it is worth saying.
	usable := make([]bool, len(kp.Rules))
	for i, w := range kp.Rules {
		at := at.Key("rules").Index(i)
		r, ok, rps := compileRule(at, w)
		ps = append(ps, rps...)
		r.Name = config.Path(at[1:]).String()
		rs.List = append(rs.List, r)
		usable[i] = ok
		rs.namesPaths = rs.namesPaths || r.Paths != nil
	}
	for j := range rs.List {
		for i := 0; i < j && usable[j]; i++ {
			if usable[i] && rs.List[i].covers(&rs.List[j]) {
				ps = append(ps, at.Key("rules").Index(j).Problemf("never matches: rules[%d] (%s) comes first and matches every request this one would; reorder them or remove this one", i, rs.List[i].Text))
				break
			}
		}
	}
	switch kp.Default {
	case "":
	case RuleAllow, RuleDeny:
		for i, r := range rs.List {
			if usable[i] && r.Methods == nil && (r.Paths == nil || slices.ContainsFunc(r.Paths, func(p PathPattern) bool { return p.covers(anyPath) })) {
				ps = append(ps, at.Key("default").Problemf("never applies: rules[%d] (%s) matches every request", i, r.Text))
				break
			}
		}
	default:
		ps = append(ps, at.Key("default").Problemf("must be %q or %q, not %q", RuleAllow, RuleDeny, kp.Default))
	}
	if kp.Mode != "" && kp.Mode != ModeEnforce && kp.Mode != ModeWarn {
		ps = append(ps, at.Key("mode").Problemf("must be %q or %q, not %q", ModeEnforce, ModeWarn, kp.Mode))
	}
	if len(rs.List) == 0 && rs.DefaultAllow {
		return nil, ps
	}
	return rs, ps
}

// compileRule reads one rule; ok is false when it cannot match anything
// as written (a problem says why).
func compileRule(at config.Path, w config.Rule) (r Rule, ok bool, ps config.Problems) {
	m := w.Allow
	r.Allow = true
	action := RuleAllow
	switch {
	case (w.Allow == nil) == (w.Deny == nil):
		return r, false, config.Problems{at.Problemf(`a rule is {"allow": {...}} or {"deny": {...}}, exactly one of them ({} matches every request)`)}
	case w.Deny != nil:
		m, r.Allow, action = w.Deny, false, RuleDeny
	}
	at = at.Key(action)
	ok = true
	text := []string{action}
	if m.Methods != nil {
		if len(m.Methods) == 0 {
			ps = append(ps, at.Key("methods").Problemf("an empty list matches no request: leave it out to match any method"))
			ok = false
		}
		r.Methods = []string{}
		for k, method := range m.Methods {
			if method == "*" || !methodToken(method) {
				ps = append(ps, at.Key("methods").Index(k).Problemf("%q is not an HTTP method (leave \"methods\" out to match any)", method))
				ok = false
				continue
			}
			if u := upperASCII(method); !slices.Contains(r.Methods, u) {
				r.Methods = append(r.Methods, u)
			}
		}
		text = append(text, strings.Join(r.Methods, ","))
	}
	if m.Paths != nil {
		if len(m.Paths) == 0 {
			ps = append(ps, at.Key("paths").Problemf("an empty list matches no request: leave it out to match any path"))
			ok = false
		}
		r.Paths = []PathPattern{}
		for k, raw := range m.Paths {
			p, err := CompilePathPattern(raw)
			if err != nil {
				ps = append(ps, at.Key("paths").Index(k).Problemf("%q: %v", raw, err))
				ok = false
				continue
			}
			r.Paths = append(r.Paths, p)
			text = append(text, p.Text)
		}
	}
	if len(text) == 1 {
		text = append(text, "every request")
	}
	r.Text = strings.Join(text, " ")
	return r, ok, ps
}

// covers reports whether r matches every request q matches, so q after r
// never decides anything.
func (r *Rule) covers(q *Rule) bool {
	if r.Methods != nil && (q.Methods == nil || !isSubset(q.Methods, r.Methods)) {
		return false
	}
	if r.Paths == nil {
		return true
	}
	qPaths := q.Paths
	if qPaths == nil {
		qPaths = []PathPattern{anyPath}
	}
	for _, qp := range qPaths {
		if !slices.ContainsFunc(r.Paths, func(p PathPattern) bool { return p.covers(qp) }) {
			return false
		}
	}
	return true
}

func isSubset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// methodToken reports whether s is an HTTP method: a token (RFC 9110
// 5.6.2).
func methodToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// sshRulesField names the request-rule field an ssh key was given, for
// the problem that refuses it.
func sshRulesField(kp config.KeyPolicy) string {
	switch {
	case kp.Rules != nil:
		return "rules"
	case kp.Default != "":
		return "default"
	}
	return "mode"
}
