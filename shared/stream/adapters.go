package stream

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

// HandleLambda serves a Lambda Function URL invocation (InvokeMode
// RESPONSE_STREAM). A refusal is an ordinary answer; a stream is answered
// at once with its headers and a body the Lambda runtime reads while the
// session writes it (an io.Pipe), so each event reaches the client as it is
// written. The session outlives this call: the runtime reads the body to
// its end (or closes it when the client is gone) before the invocation
// ends, and its context stays live until then.
//
// The response is a pointer: LambdaFunctionURLStreamingResponse's methods
// (Read, ContentType) have pointer receivers, and only through them does
// the runtime send the streaming wire format (prelude, 8 NUL bytes, body).
func (h *Handler) HandleLambda(ctx context.Context, ev events.LambdaFunctionURLRequest) (*events.LambdaFunctionURLStreamingResponse, error) {
	headers := make(map[string]string, len(ev.Headers))
	for k, v := range ev.Headers {
		headers[strings.ToLower(k)] = v
	}
	req := request{
		method:    ev.RequestContext.HTTP.Method,
		rawPath:   ev.RawPath,
		rawQuery:  ev.RawQueryString,
		requestID: ev.RequestContext.RequestID,
		header: func(name string) (string, bool) {
			v, ok := headers[name]
			return v, ok
		},
	}
	sess, refused := h.open(ctx, req)
	if refused != nil {
		hdr := map[string]string{"content-type": "application/json", "cache-control": "no-store"}
		if refused.allow != "" {
			hdr["allow"] = refused.allow
		}
		if refused.retryAfter != "" {
			hdr["retry-after"] = refused.retryAfter
		}
		return &events.LambdaFunctionURLStreamingResponse{
			StatusCode: refused.status, Headers: hdr, Body: bytes.NewReader(refused.body),
		}, nil
	}
	pr, pw := io.Pipe()
	go func() {
		sess.serve(ctx, pipeSink{pw})
		pw.Close()
	}()
	return &events.LambdaFunctionURLStreamingResponse{StatusCode: http.StatusOK, Headers: sseHeaders(), Body: pr}, nil
}

// pipeSink writes into the pipe the Lambda runtime reads: a Write returns
// once the runtime has taken the bytes.
type pipeSink struct{ w *io.PipeWriter }

func (p pipeSink) Write(b []byte) error {
	_, err := p.w.Write(b)
	return err
}

// Abort closes the pipe, failing a blocked Write. The runtime's read ends
// in an error, so the client sees the stream break off (a partial SSE
// message is discarded by SSE clients, so Last-Event-ID stays exact).
func (p pipeSink) Abort() { p.w.CloseWithError(errCutOff) }

// ServeHTTP serves the stream over net/http (the local stack): the same
// session, writing to the response and flushing each write.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req := request{
		method:    r.Method,
		rawPath:   r.URL.EscapedPath(),
		rawQuery:  r.URL.RawQuery,
		requestID: "local-stream-" + strconv.FormatUint(h.seq.Add(1), 10),
		header: func(name string) (string, bool) {
			vals := r.Header.Values(name)
			if len(vals) == 0 {
				return "", false
			}
			return strings.Join(vals, ","), true
		},
	}
	sess, refused := h.open(r.Context(), req)
	if refused != nil {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if refused.allow != "" {
			w.Header().Set("Allow", refused.allow)
		}
		if refused.retryAfter != "" {
			w.Header().Set("Retry-After", refused.retryAfter)
		}
		w.WriteHeader(refused.status)
		w.Write(refused.body)
		return
	}
	for k, v := range sseHeaders() {
		w.Header().Set(k, v)
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		h.log.Error("stream: the response cannot be flushed", logErr, err.Error())
		sess.release(r.Context())
		return
	}
	sess.serve(r.Context(), &httpSink{w: w, rc: rc})
}

// httpSink writes to a response, flushing each write.
type httpSink struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (s *httpSink) Write(b []byte) error {
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.rc.Flush()
}

// Abort sets the connection's write deadline in the past: a write blocked
// on a client that does not read fails now, and so does every later one,
// so the server closes the connection. (Any past instant does; the wall
// clock is not read.)
func (s *httpSink) Abort() { _ = s.rc.SetWriteDeadline(time.Unix(1, 0)) }
