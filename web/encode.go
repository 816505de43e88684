package web

import (
	"bytes"
	"encoding/json"
)

// encodeJSON is the JSON encoder of every API response: encoding/json without HTML escaping.
// Stored metadata and responses (json.RawMessage) are then sent as the client stored them,
// byte for byte up to insignificant whitespace, instead of with <, > and & rewritten as \u
// escapes (the same JSON value, but not the same bytes, which breaks a replay that compares
// or hashes bodies). encoding/json still escapes raw U+2028 and U+2029 whatever the setting. The escaping protects JSON embedded in HTML; API
// answers are application/json with X-Content-Type-Options: nosniff and never embedded.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
