package api

import (
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

func TestRequestBaseIsWhereTheCallerReachedTheAPI(t *testing.T) {
	ev := func(domain, stage string) events.APIGatewayV2HTTPRequest {
		return events.APIGatewayV2HTTPRequest{RequestContext: events.APIGatewayV2HTTPRequestContext{DomainName: domain, Stage: stage}}
	}
	for _, c := range []struct {
		name    string
		ev      events.APIGatewayV2HTTPRequest
		headers map[string]string
		want    string
	}{
		{"API Gateway's default stage", ev("abc123.execute-api.eu-west-1.amazonaws.com", "$default"),
			map[string]string{"x-forwarded-proto": "https"}, "https://abc123.execute-api.eu-west-1.amazonaws.com"},
		{"a named stage", ev("abc123.execute-api.eu-west-1.amazonaws.com", "prod"),
			map[string]string{"x-forwarded-proto": "https"}, "https://abc123.execute-api.eu-west-1.amazonaws.com/prod"},
		{"no proto header: https", ev("api.example.com", ""), nil, "https://api.example.com"},
		{"the local adapter over http", ev("127.0.0.1:8080", "$default"),
			map[string]string{"x-forwarded-proto": "http"}, "http://127.0.0.1:8080"},
		{"a proxy chain, first hop wins", ev("api.example.com", "$default"),
			map[string]string{"x-forwarded-proto": "https, http"}, "https://api.example.com"},
		{"no domain in the context: the Host header", ev("", "$default"),
			map[string]string{"host": "fleet.internal:9000", "x-forwarded-proto": "http"}, "http://fleet.internal:9000"},
	} {
		if got := requestBase(c.ev, c.headers); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	l := linker{api: "https://api.example.com", stream: "https://s.lambda-url.eu-west-1.on.aws"}
	got := l.run("fr-abc")
	if got.Self != "https://api.example.com/fleet/runs/fr-abc" || got.Events != "https://api.example.com/fleet/runs/fr-abc/events" ||
		got.Stream != "https://s.lambda-url.eu-west-1.on.aws/fleet/runs/fr-abc/stream" || got.Egress != "https://api.example.com/fleet/runs/fr-abc/egress" {
		t.Fatalf("links %+v", got)
	}
}
