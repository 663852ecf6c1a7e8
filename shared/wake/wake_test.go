package wake

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

var moto *motoserver.Server

func TestMain(m *testing.M) {
	os.Exit(motoserver.Run(m, func(s *motoserver.Server) { moto = s }))
}

// TestMessageGolden pins the message a queue carries: a deploy may leave
// messages of the old format in the queue for the new dispatcher.
func TestMessageGolden(t *testing.T) {
	body, err := encode(fleet.Wake{HostID: "edge-1", Slots: 2, Reason: fleet.WakeRunEnded})
	const golden = `{"v":1,"hostId":"edge-1","slots":2,"reason":"run_ended"}`
	if err != nil || body != golden {
		t.Fatalf("encode = %s, %v\nwant %s", body, err, golden)
	}
	w, err := decode(golden)
	if err != nil || w != (fleet.Wake{HostID: "edge-1", Slots: 2, Reason: fleet.WakeRunEnded}) {
		t.Fatalf("decode = %+v, %v", w, err)
	}
}

func TestDecodeRefusesWhatIsNotAWake(t *testing.T) {
	for body, want := range map[string]string{
		``:      "not a wake message",
		`hello`: "not a wake message",
		`{"v":1,"hostId":"h","slots":1,"reason":"probe","extra":1}`: "unknown field",
		`{"v":1,"hostId":"h","slots":1} {}`:                         "more after the JSON object",
		`{"v":2,"hostId":"h","slots":1}`:                            "version 2",
		`{"hostId":"h","slots":1}`:                                  "version 0",
		`{"v":1,"hostId":"","slots":1}`:                             `host ""`,
		`{"v":1,"hostId":"h","slots":0}`:                            "0 slots",
	} {
		if _, err := decode(body); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("decode(%q) = %v, want an error saying %q", body, err, want)
		}
	}
}

func TestCoalesceAddsOneHostsSlots(t *testing.T) {
	got := coalesce([]fleet.Wake{
		{HostID: "b", Slots: 1, Reason: fleet.WakeRunEnded},
		{HostID: "a", Slots: 3, Reason: fleet.WakeProbe},
		{HostID: "b", Slots: 2, Reason: fleet.WakeProbe},
	})
	want := []fleet.Wake{{HostID: "b", Slots: 3, Reason: fleet.WakeRunEnded}, {HostID: "a", Slots: 3, Reason: fleet.WakeProbe}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("coalesce = %+v, want %+v", got, want)
	}
	if _, err := encodeAll([]fleet.Wake{{HostID: "a", Slots: 1}, {HostID: "", Slots: 1}}); err == nil {
		t.Fatal("a wake without a host was encoded")
	}
	if _, err := encodeAll([]fleet.Wake{{HostID: "a", Slots: 0}}); err == nil {
		t.Fatal("a wake without a slot was encoded")
	}
}
