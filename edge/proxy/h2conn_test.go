package proxy

import (
	"bytes"
	"testing"

	"golang.org/x/net/http2"
)

// A SETTINGS frame naming a parameter twice reaches x/net with the last
// value of each, in the order of their last occurrence; one without
// duplicates, or with a value x/net refuses, is passed as it is.
func TestDedupSettingsKeepsTheLastValueOfEach(t *testing.T) {
	frame := func(stream uint32, settings ...http2.Setting) []byte {
		var payload, b bytes.Buffer
		must(t, http2.NewFramer(&payload, nil).WriteSettings(settings...))
		must(t, http2.NewFramer(&b, nil).WriteRawFrame(http2.FrameSettings, 0, stream, payload.Bytes()[9:]))
		return b.Bytes()
	}
	window, push, size := http2.SettingInitialWindowSize, http2.SettingEnablePush, http2.SettingMaxFrameSize
	for _, c := range []struct {
		name     string
		in, want []byte
	}{
		{"two window sizes", frame(0, http2.Setting{ID: window, Val: 100}, http2.Setting{ID: window, Val: 1}),
			frame(0, http2.Setting{ID: window, Val: 1})},
		{"interleaved", frame(0, http2.Setting{ID: window, Val: 100}, http2.Setting{ID: push, Val: 0}, http2.Setting{ID: window, Val: 7}, http2.Setting{ID: push, Val: 1}),
			frame(0, http2.Setting{ID: window, Val: 7}, http2.Setting{ID: push, Val: 1})},
		{"no duplicate", frame(0, http2.Setting{ID: window, Val: 100}, http2.Setting{ID: push, Val: 0}),
			frame(0, http2.Setting{ID: window, Val: 100}, http2.Setting{ID: push, Val: 0})},
		{"an invalid value", frame(0, http2.Setting{ID: size, Val: 1}, http2.Setting{ID: size, Val: 16384}),
			frame(0, http2.Setting{ID: size, Val: 1}, http2.Setting{ID: size, Val: 16384})},
		{"on a stream", frame(1, http2.Setting{ID: window, Val: 1}, http2.Setting{ID: window, Val: 2}),
			frame(1, http2.Setting{ID: window, Val: 1}, http2.Setting{ID: window, Val: 2})},
	} {
		if got := dedupSettings(append([]byte(nil), c.in...)); !bytes.Equal(got, c.want) {
			t.Errorf("%s: % x, want % x", c.name, got, c.want)
		}
	}
}
