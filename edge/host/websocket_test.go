package host

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// pythonWebSocketClient is a task's WebSocket client on Debian's
// python3-websockets (10.4), as its users write one: it sends its key in
// the handshake, prints what the upstream says, then sends the key in a
// message (API_TOKEN may travel in headers only) and prints the close code.
// websockets 10.4 reads no proxy variable, so its connection is redirected
// to the proxy's transparent front; it offers permessage-deflate by
// default.
const pythonWebSocketClient = `/usr/bin/python3 - "$URL" <<'PY'
import asyncio, os, sys, websockets
async def main():
    token = os.environ["API_TOKEN"]
    async with websockets.connect(sys.argv[1], extra_headers={"Authorization": "Bearer " + token}, open_timeout=15) as ws:
        print("first=" + await ws.recv())
        await ws.send("hello")
        print("second=" + await ws.recv())
        await ws.send("key=" + token)
        try:
            print("third=" + await ws.recv())
        except websockets.ConnectionClosed as e:
            print("closed=%s" % (e.rcvd.code if e.rcvd else None))
asyncio.run(asyncio.wait_for(main(), 20))
PY
`

// A granted upstream that echoes the handshake's Authorization in a frame
// shows a real client its placeholder, never the value; a message holding
// the placeholder of a header-only key is blocked (1008) before any of it
// reaches the upstream, and audited; the client's compression offer never
// reaches the upstream.
func TestPythonWebSocketClientSeesOnlyItsPlaceholder(t *testing.T) {
	f := newFixture(t)
	var mu sync.Mutex
	var got, extensions []string
	f.upstream = f.ca.TLSServer(t, websocket.Server{Handler: func(c *websocket.Conn) {
		mu.Lock()
		extensions = append(extensions, c.Request().Header.Values("Sec-WebSocket-Extensions")...)
		mu.Unlock()
		websocket.Message.Send(c, "auth="+c.Request().Header.Get("Authorization"))
		var msg string
		for websocket.Message.Receive(c, &msg) == nil {
			mu.Lock()
			got = append(got, msg)
			mu.Unlock()
			websocket.Message.Send(c, "echo: "+msg)
		}
	}}, "api.example.test")
	f.upstreamHost = "api.example.test:" + port(f.upstream)
	e := f.open(hostOptions{})
	prompt := fmt.Sprintf("echo \"placeholder=$API_TOKEN\"\nURL=wss://%s/ws\n%s", f.upstreamHost, pythonWebSocketClient)
	run := e.start(runspec.Request{Prompt: prompt, Secrets: e.apiToken()})
	e.waitEnd(run.RunID)
	out := e.output(run.RunID)
	raw, _ := json.Marshal(e.events(run.RunID))
	if strings.Contains(string(raw), realSecret) {
		t.Fatal("the task saw the real value") // its output is not shown: it holds the secret
	}
	placeholder := envLine(out, "placeholder")
	if !strings.HasPrefix(placeholder, "ph-") {
		t.Fatalf("the task's API_TOKEN is %q; output:\n%s", placeholder, out)
	}
	if first := envLine(out, "first"); first != "auth=Bearer "+placeholder {
		t.Errorf("the upstream's echo of the handshake reached the task as %q, want its placeholder; output:\n%s", first, out)
	}
	if second, closed := envLine(out, "second"), envLine(out, "closed"); second != "echo: hello" || closed != "1008" {
		t.Errorf("second message %q, close code %q; output:\n%s", second, closed, out)
	}
	mu.Lock()
	if len(got) != 1 || got[0] != "hello" || len(extensions) != 0 {
		t.Errorf("the upstream got messages %q and extension offers %q, want only hello and no offer", got, extensions)
	}
	mu.Unlock()
	var lines []audit.Entry
	await.Within(10*time.Second, func() bool {
		lines = auditLines(t, f, run.RunID)
		return len(lines) >= 2
	})
	var blocked, handshake int
	for _, l := range lines {
		switch {
		case l.Action == audit.Blocked && strings.HasPrefix(l.Reason, "websocket message blocked") && fmt.Sprint(l.Keys) == "[acme/API_TOKEN]":
			blocked++
		case l.Action == audit.Substituted && l.Status == 101 && l.Via == audit.ViaTransparent:
			handshake++
		}
	}
	if blocked != 1 || handshake != 1 {
		t.Errorf("audit: %d blocked message lines and %d handshake lines, want one each: %+v", blocked, handshake, lines)
	}
}
