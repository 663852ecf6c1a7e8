package storetest

import (
	"fmt"
	"sort"
	"testing"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
)

// testHostsListPages: paging the registry a few hosts at a time gives
// every host once, whole, in pages no larger than asked, and ends.
func testHostsListPages(t *testing.T, s store.Store, clk *clock.Fake) {
	var want []string
	for i := range 7 {
		id := fmt.Sprintf("h%d", i)
		noErr(t, "CreateHost", s.CreateHost(bg, host(id, clk.Now())))
		want = append(want, id)
	}
	all, err := s.ListHosts(bg)
	noErr(t, "ListHosts", err)
	byID := map[string]store.Host{}
	for _, h := range all {
		byID[h.ID] = h
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatal("ListHostsPage never ended")
		}
		p, err := s.ListHostsPage(bg, after, 3)
		noErr(t, "ListHostsPage", err)
		if len(p.Hosts) > 3 {
			t.Fatalf("a page of %d hosts, limit 3", len(p.Hosts))
		}
		for _, h := range p.Hosts {
			sameJSON(t, "a paged host is the whole host", h, byID[h.ID])
			got = append(got, h.ID)
		}
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	sort.Strings(got)
	sameIDs(t, "every host paged once", got, want)
}
