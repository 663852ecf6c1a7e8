package lambdahttp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestRoundTrip serves a Lambda handler that records its event and answers
// with every response feature, and checks both directions over real HTTP.
func TestRoundTrip(t *testing.T) {
	var got events.APIGatewayV2HTTPRequest
	handler := func(_ context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		got = ev
		return events.APIGatewayV2HTTPResponse{
			StatusCode:        201,
			Headers:           map[string]string{"content-type": "application/octet-stream"},
			MultiValueHeaders: map[string][]string{"x-multi": {"a", "b"}},
			Cookies:           []string{"s=1; Path=/"},
			Body:              base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 255}),
			IsBase64Encoded:   true,
		}, nil
	}
	h, err := New(Config{Handler: handler, Logger: discard(), NewRequestID: func() string { return "req-1" }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	req, _ := http.NewRequest("POST", srv.URL+"/fleet/runs/a%2Fb?limit=5&x=1&x=2", strings.NewReader(`{"agent":"shell"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer t")
	req.Header.Add("X-Repeat", "1")
	req.Header.Add("X-Repeat", "2")
	req.Header.Set("Cookie", "a=1; b=2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	if got.Version != "2.0" || got.RouteKey != "$default" || got.RequestContext.HTTP.Method != "POST" ||
		got.RawPath != "/fleet/runs/a%2Fb" || got.RequestContext.HTTP.Path != "/fleet/runs/a/b" ||
		got.RawQueryString != "limit=5&x=1&x=2" || got.QueryStringParameters["x"] != "1,2" ||
		got.Headers["authorization"] != "Bearer t" || got.Headers["x-repeat"] != "1,2" ||
		got.Body != `{"agent":"shell"}` || got.IsBase64Encoded || got.RequestContext.RequestID != "req-1" ||
		got.RequestContext.HTTP.SourceIP != "127.0.0.1" || strings.Join(got.Cookies, "|") != "a=1|b=2" {
		t.Fatalf("event = %+v", got)
	}
	if resp.StatusCode != 201 || !bytes.Equal(body, []byte{0, 1, 2, 255}) ||
		strings.Join(resp.Header.Values("X-Multi"), ",") != "a,b" || resp.Header.Get("Set-Cookie") != "s=1; Path=/" {
		t.Fatalf("response %d %v %v", resp.StatusCode, resp.Header, body)
	}

	// A binary body reaches the handler base64-encoded, as from API Gateway.
	resp, err = http.Post(srv.URL+"/x", "application/octet-stream", bytes.NewReader([]byte{0xff, 0}))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !got.IsBase64Encoded || got.Body != base64.StdEncoding.EncodeToString([]byte{0xff, 0}) {
		t.Fatalf("binary body event: %q %v", got.Body, got.IsBase64Encoded)
	}
}

func TestHandlerErrorIs500AndTooLargeIs413(t *testing.T) {
	calls := 0
	h, _ := New(Config{Logger: discard(), Handler: func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		calls++
		return events.APIGatewayV2HTTPResponse{}, errors.New("boom: secret internals")
	}})
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || strings.Contains(string(body), "secret") {
		t.Fatalf("handler error: %d %s", resp.StatusCode, body)
	}
	resp, err = http.Post(srv.URL+"/", "application/json", bytes.NewReader(make([]byte, MaxBodyBytes+1)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 || calls != 1 {
		t.Fatalf("oversized body: %d, handler called %d times", resp.StatusCode, calls)
	}
}
