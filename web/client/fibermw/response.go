package fibermw

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/textproto"
	"unicode/utf8"

	"github.com/idemgate/idemgate/web/client"
)

// storedResponse is the response the middleware records as an operation's outcome `response`
// (docs/reference.md §4; any JSON up to 64 KiB) and replays to duplicates. A JSON body is stored as
// JSON, so operators read it on the dashboard; any other body as base64. A response whose
// record would pass 64 KiB is stored without its body (BodyOmitted, BodyBytes).
type storedResponse struct {
	Format      int                 `json:"fibermw"` // storedFormat
	Status      int                 `json:"status"`
	Headers     map[string][]string `json:"headers,omitempty"`
	Body        json.RawMessage     `json:"body,omitempty"`
	BodyBase64  string              `json:"body_base64,omitempty"`
	BodyOmitted bool                `json:"body_omitted,omitempty"`
	BodyBytes   int                 `json:"body_bytes,omitempty"`
}

// storedFormat marks a response stored by this middleware, version 1.
const storedFormat = 1

// encodeResponse builds the record of a response, at most client.MaxResponseBytes long.
func encodeResponse(status int, headers map[string][]string, contentType string, body []byte) []byte {
	r := storedResponse{Format: storedFormat, Status: status, Headers: headers}
	switch {
	case len(body) == 0:
	case jsonRoundTrips(mediaType(contentType), body):
		r.Body = body
	default:
		r.BodyBase64 = base64.StdEncoding.EncodeToString(body)
	}
	out, err := json.Marshal(r)
	if err == nil && len(out) <= client.MaxResponseBytes {
		return out
	}
	r.Body, r.BodyBase64, r.BodyOmitted, r.BodyBytes = nil, "", true, len(body)
	if out, err = json.Marshal(r); err == nil && len(out) <= client.MaxResponseBytes {
		return out
	}
	r.Headers = nil // only absurd headers get here
	out, _ = json.Marshal(r)
	return out
}

// jsonRoundTrips reports whether a body can be stored as a JSON value and come back byte for
// byte. The record is built with encoding/json, which compacts a raw JSON value and escapes
// <, >, &, U+2028 and U+2029 in it, and idemgate hands the stored value back as it was
// stored; a body already in that form (what Fiber's default c.JSON writes) survives
// unchanged, anything else (indented JSON, a trailing newline, a raw &) is stored as base64.
func jsonRoundTrips(mt string, body []byte) bool {
	if !isJSONType(mt) || !utf8.Valid(body) || !json.Valid(body) {
		return false
	}
	var compact, escaped bytes.Buffer
	if json.Compact(&compact, body) != nil {
		return false
	}
	json.HTMLEscape(&escaped, compact.Bytes())
	return bytes.Equal(escaped.Bytes(), body)
}

// decodeResponse reads a record written by encodeResponse; ok is false for anything else (an
// outcome recorded by an operator or another client).
func decodeResponse(raw json.RawMessage) (r storedResponse, body []byte, ok bool) {
	if len(raw) == 0 || json.Unmarshal(raw, &r) != nil || r.Format != storedFormat || r.Status < 100 || r.Status > 999 {
		return r, nil, false
	}
	if r.BodyOmitted {
		return r, nil, true
	}
	if r.BodyBase64 != "" {
		b, err := base64.StdEncoding.DecodeString(r.BodyBase64)
		if err != nil {
			return r, nil, false
		}
		return r, b, true
	}
	return r, r.Body, true
}

// canonicalHeader returns the canonical form of a header name (Content-Type).
func canonicalHeader(name string) string { return textproto.CanonicalMIMEHeaderKey(name) }
