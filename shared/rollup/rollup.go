// Package rollup owns the metrics rollup: the Prometheus scrapes of several
// hosts merged into one exposition (text format 0.0.4), every series
// labelled with the host it came from. Parsing and writing are
// prometheus/common's expfmt; the decisions (what merges, what is dropped
// and why) are Merge's, a pure function.
package rollup

import (
	"bytes"
	"fmt"
	"io"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
)

// ContentType is the rollup's content type: Prometheus text format 0.0.4.
const ContentType = string(expfmt.FmtText)

// HostLabel is the label every series carries: the host's registry id. A
// host's own "host" label is kept as "exported_host" (Prometheus' rule for
// a target label that clashes with a scraped one).
const HostLabel = "host"

// The rollup's own families.
const (
	// UpFamily: 1 for each host whose scrape was merged, 0 for one that
	// failed (unreachable, refused, unparseable).
	UpFamily = "runfleet_rollup_up"
	// DroppedFamily: per host, how many of the host's families this rollup
	// dropped. Like every series it carries the host it is about: a family
	// dropped because two hosts disagree counts on each of them (so the
	// series do not add up to the number of families dropped; Result.Dropped
	// and the log have that).
	DroppedFamily = "runfleet_rollup_dropped_families"
	// reservedPrefix is the rollup's namespace; a host's family in it is dropped.
	reservedPrefix = "runfleet_rollup_"
)

// Scrape is one host's answer to GET /metrics.
type Scrape struct {
	Host string
	// Text is the exposition the host answered (text format).
	Text []byte
	// Err is why the scrape failed; Text is ignored when set.
	Err error
}

// Drop is a family left out of the rollup, and why.
type Drop struct {
	Family string   `json:"family"`
	Reason string   `json:"reason"`
	Hosts  []string `json:"hosts"`
}

// Failure is a host whose scrape could not be merged.
type Failure struct {
	Host   string `json:"host"`
	Reason string `json:"reason"`
}

// Result is a merged rollup.
type Result struct {
	// Families are the merged families, by name, the rollup's own last.
	Families []*dto.MetricFamily
	// Dropped are the families left out, by name.
	Dropped []Drop
	// Failed are the hosts whose scrape was not merged, by host.
	Failed []Failure
}

// Merge merges scrapes. A family merges when every host that has it agrees
// on its type, and on its help where both give one; otherwise it is dropped
// whole (a series under the wrong type or meaning would mislead more than a
// missing one). A family whose name text format 0.0.4 cannot carry, or in
// the rollup's own namespace, is dropped too. A scrape that failed or does
// not parse contributes nothing and is reported in Failed (and as up 0).
func Merge(scrapes []Scrape) Result {
	sorted := append([]Scrape(nil), scrapes...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Host < sorted[j].Host })

	byName := map[string][]part{}
	var res Result
	up := map[string]bool{}
	for _, s := range sorted {
		if s.Err != nil {
			res.Failed = append(res.Failed, Failure{Host: s.Host, Reason: s.Err.Error()})
			up[s.Host] = false
			continue
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(bytes.NewReader(s.Text))
		if err != nil {
			res.Failed = append(res.Failed, Failure{Host: s.Host, Reason: "unparseable exposition: " + err.Error()})
			up[s.Host] = false
			continue
		}
		up[s.Host] = true
		for name, mf := range families {
			byName[name] = append(byName[name], part{host: s.Host, mf: mf})
		}
	}

	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		parts := byName[name]
		hosts := make([]string, len(parts))
		for i, p := range parts {
			hosts[i] = p.host
		}
		if reason := dropReason(name, parts); reason != "" {
			res.Dropped = append(res.Dropped, Drop{Family: name, Reason: reason, Hosts: hosts})
			continue
		}
		merged := &dto.MetricFamily{Name: proto.String(name), Type: parts[0].mf.Type.Enum()}
		for _, p := range parts {
			if merged.GetHelp() == "" && p.mf.GetHelp() != "" {
				merged.Help = proto.String(p.mf.GetHelp())
			}
			for _, m := range p.mf.Metric {
				merged.Metric = append(merged.Metric, withHost(m, p.host))
			}
		}
		res.Families = append(res.Families, merged)
	}
	res.Families = append(res.Families, ownFamilies(up, res.Dropped)...)
	return res
}

// part is one host's family of a name.
type part struct {
	host string
	mf   *dto.MetricFamily
}

// dropReason says why a family cannot be merged, "" when it can.
func dropReason(name string, parts []part) string {
	if strings.HasPrefix(name, reservedPrefix) {
		return "the name is in the rollup's own namespace " + reservedPrefix
	}
	if !model.LegacyValidation.IsValidMetricName(name) {
		return "the name is not valid in text format 0.0.4"
	}
	first := parts[0]
	help, helpHost := "", ""
	for _, p := range parts {
		if p.mf.GetType() != first.mf.GetType() {
			return fmt.Sprintf("the type differs across hosts: %s on %s, %s on %s",
				first.mf.GetType(), first.host, p.mf.GetType(), p.host)
		}
		if h := p.mf.GetHelp(); h != "" {
			if help != "" && h != help {
				return fmt.Sprintf("the help differs across hosts: %q on %s, %q on %s", help, helpHost, h, p.host)
			}
			help, helpHost = h, p.host
		}
		for _, m := range p.mf.Metric {
			for _, l := range m.Label {
				if !model.LegacyValidation.IsValidLabelName(l.GetName()) {
					return fmt.Sprintf("label %q on %s is not valid in text format 0.0.4", l.GetName(), p.host)
				}
			}
		}
	}
	return ""
}

// withHost copies m with the host label added (a scraped "host" label
// moves to "exported_host", and so on), labels sorted by name.
func withHost(m *dto.Metric, host string) *dto.Metric {
	out := proto.Clone(m).(*dto.Metric)
	taken := map[string]bool{}
	for _, l := range out.Label {
		taken[l.GetName()] = true
	}
	for _, l := range out.Label {
		if l.GetName() != HostLabel {
			continue
		}
		name := "exported_" + HostLabel
		for taken[name] {
			name = "exported_" + name
		}
		l.Name = proto.String(name)
		taken[name] = true
	}
	out.Label = append(out.Label, &dto.LabelPair{Name: proto.String(HostLabel), Value: proto.String(host)})
	sort.Slice(out.Label, func(i, j int) bool { return out.Label[i].GetName() < out.Label[j].GetName() })
	return out
}

// ownFamilies are the rollup's account of itself, one series per host
// scraped (none when there was no host to scrape).
func ownFamilies(up map[string]bool, dropped []Drop) []*dto.MetricFamily {
	if len(up) == 0 {
		return nil
	}
	hosts := make([]string, 0, len(up))
	for h := range up {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	droppedOf := map[string]int{}
	for _, d := range dropped {
		for _, h := range d.Hosts {
			droppedOf[h]++
		}
	}
	droppedFamily := &dto.MetricFamily{
		Name: proto.String(DroppedFamily),
		Help: proto.String("Metric families of the host this rollup dropped: hosts disagree on their type or help, or text format 0.0.4 cannot carry their name."),
		Type: dto.MetricType_GAUGE.Enum(),
	}
	upFamily := &dto.MetricFamily{
		Name: proto.String(UpFamily),
		Help: proto.String("Whether the rollup merged the host's scrape (1) or the scrape failed (0)."),
		Type: dto.MetricType_GAUGE.Enum(),
	}
	for _, h := range hosts {
		v := 0.0
		if up[h] {
			v = 1
		}
		upFamily.Metric = append(upFamily.Metric, gauge(h, v))
		droppedFamily.Metric = append(droppedFamily.Metric, gauge(h, float64(droppedOf[h])))
	}
	return []*dto.MetricFamily{droppedFamily, upFamily}
}

func gauge(host string, v float64) *dto.Metric {
	return &dto.Metric{
		Label: []*dto.LabelPair{{Name: proto.String(HostLabel), Value: proto.String(host)}},
		Gauge: &dto.Gauge{Value: proto.Float64(v)},
	}
}

// WriteText writes the rollup in text format 0.0.4.
func (r Result) WriteText(w io.Writer) error {
	for _, mf := range r.Families {
		if _, err := expfmt.MetricFamilyToText(w, mf); err != nil {
			return fmt.Errorf("rollup: writing %s: %w", mf.GetName(), err)
		}
	}
	return nil
}

// Text is WriteText into memory.
func (r Result) Text() ([]byte, error) {
	var buf bytes.Buffer
	if err := r.WriteText(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
