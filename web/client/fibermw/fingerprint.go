package fibermw

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"mime"
	"net/url"
	"strings"
)

// fingerprintVersion starts every fingerprint's input, so a future change of the recipe
// cannot collide with today's fingerprints.
//
// Version 2 compares JSON numbers exactly (canonicalJSON); version 1 read them as doubles. A
// retry that spans an upgrade therefore sees a different fingerprint and is refused with 422,
// the safe direction: never a replay of another request's response.
const fingerprintVersion = "idemgate-fibermw-fingerprint/2"

// request is what a fingerprint covers.
type request struct {
	Method      string
	Path        string // decoded path, as the router saw it
	RawQuery    string
	ContentType string
	Headers     [][2]string // lower-cased name, value; in Config.FingerprintHeaders order
	Body        []byte
}

// fingerprint returns "sha256:" and the hex SHA-256 of the request's method, path, query
// (parameters sorted by name), media type, the configured headers and canonical body. Each
// part is length-prefixed, so no two different requests feed the hash the same bytes. The
// body is canonicalised by canonicalBody.
func fingerprint(r request) string {
	h := sha256.New()
	mt := mediaType(r.ContentType)
	kind, body := canonicalBody(mt, r.Body)
	for _, part := range []string{fingerprintVersion, r.Method, r.Path, canonicalQuery(r.RawQuery), mt} {
		writePart(h, []byte(part))
	}
	for _, hv := range r.Headers {
		writePart(h, []byte(hv[0]))
		writePart(h, []byte(hv[1]))
	}
	writePart(h, []byte(kind))
	writePart(h, body)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func writePart(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// canonicalBody returns a body in a form in which the same content compares equal: a JSON
// body (media type application/json or any +json) that has a canonical form (canonicalJSON)
// becomes it, so member order, white space, escape spelling and number spelling (1.0, 1e0)
// do not matter while every number is compared exactly; any other body is used byte for
// byte. kind says which, so a raw body can never collide with a canonical one.
func canonicalBody(mt string, body []byte) (kind string, out []byte) {
	if len(body) > 0 && isJSONType(mt) {
		if c, err := canonicalJSON(body); err == nil {
			return "json", c
		}
	}
	return "raw", body
}

// canonicalQuery sorts a query's parameters by name (url.Values.Encode); a query that does
// not parse is used as it is.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return raw
	}
	return q.Encode()
}

// mediaType returns a Content-Type's lower-cased media type without parameters.
func mediaType(ct string) string {
	if ct == "" {
		return ""
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		mt, _, _ = strings.Cut(ct, ";")
		return strings.ToLower(strings.TrimSpace(mt))
	}
	return mt
}

func isJSONType(mt string) bool { return mt == "application/json" || strings.HasSuffix(mt, "+json") }
