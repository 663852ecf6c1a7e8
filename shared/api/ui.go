package api

import (
	"context"
	"net/http"

	"github.com/runfleet/runfleet/shared/dashboard"
)

// The dashboard's routes (package dashboard): public, since the page and
// its assets hold no data and every call the page makes carries the
// signed-in caller's token. Their answers are text, never base64 (HTML,
// CSS and JavaScript are UTF-8), with the dashboard's own caching and
// security headers.

func (h *Handler) uiPage(_ context.Context, rq *request) (int, any, error) {
	inm, _ := rq.header("if-none-match")
	return uiAnswer(h.dash.Page(inm))
}

func (h *Handler) uiFile(_ context.Context, rq *request) (int, any, error) {
	inm, _ := rq.header("if-none-match")
	a, ok := h.dash.Asset(rq.params["file"], inm)
	if !ok {
		return 0, nil, &requestError{status: http.StatusNotFound, code: codeRouteNotFound,
			message: "the dashboard has no such file (the page names its files; reload it)"}
	}
	return uiAnswer(a)
}

func uiAnswer(a dashboard.Answer) (int, any, error) {
	return a.Status, textAnswer{contentType: a.ContentType, body: a.Body, headers: a.Headers}, nil
}
