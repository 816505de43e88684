package services

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits from SPEC.md §2 and §4. Lengths are in bytes for keys and serialized JSON, and in
// characters (Unicode code points) for the other text fields.
const (
	MaxKeyBytes           = 255
	MaxOperationNameChars = 64
	MaxFingerprintChars   = 256
	MaxCorrelationIDChars = 128
	MaxAttemptIDChars     = 128
	MaxMetadataBytes      = 16 << 10
	MaxReasonChars        = 500
	MaxReceiptChars       = 512
	MaxNoteChars          = 1000
	MaxResponseBytes      = 64 << 10
	MaxBodyBytes          = 256 << 10
)

// ValidateKey checks an idempotency key against SPEC.md §2: 1–255 bytes of valid UTF-8, no
// control characters, not all whitespace. It returns "" when the key is valid, else a message
// for the caller. Keys are otherwise opaque: compared byte-exact, never normalised.
func ValidateKey(key string) string {
	switch {
	case key == "":
		return "must not be empty"
	case len(key) > MaxKeyBytes:
		return fmt.Sprintf("must be at most %d bytes of UTF-8", MaxKeyBytes)
	case !utf8.ValidString(key):
		return "must be valid UTF-8"
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return "must not contain control characters"
	case strings.TrimFunc(key, unicode.IsSpace) == "":
		return "must not be all whitespace"
	}
	return ""
}

// ValidateOperationName checks an operation name: 1–64 characters of [A-Za-z0-9._:-].
func ValidateOperationName(name string) string {
	if name == "" || len(name) > MaxOperationNameChars {
		return fmt.Sprintf("must be 1 to %d characters", MaxOperationNameChars)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:-", r)) {
			return "may contain only letters, digits, '.', '_', ':' and '-'"
		}
	}
	return ""
}

// validateText checks a free-text field: valid UTF-8, no NUL (neither database can store it in
// text), and at most max characters; empty is refused when !allowEmpty.
func validateText(s string, max int, allowEmpty bool) string {
	switch {
	case s == "" && !allowEmpty:
		return "must not be empty (omit the field instead)"
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "must not contain NUL characters"
	case utf8.RuneCountInString(s) > max:
		return fmt.Sprintf("must be at most %d characters", max)
	}
	return ""
}

// validateJSON checks a raw JSON value: well-formed, object-only when wantObject, and free of
// NUL characters in strings and member names (PostgreSQL's jsonb refuses \u0000). It returns the
// compacted form, which is what is stored and what size limits are measured on.
func validateJSON(raw json.RawMessage, wantObject bool) (json.RawMessage, string) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, "must be valid JSON"
	}
	out := buf.Bytes()
	if wantObject && (len(out) == 0 || out[0] != '{') {
		return nil, "must be a JSON object"
	}
	if bytes.Contains(out, []byte(`\u0000`)) {
		dec := json.NewDecoder(bytes.NewReader(out))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, "must be valid JSON"
		}
		if hasNUL(v) {
			return nil, "must not contain NUL characters (\\u0000)"
		}
	}
	return out, ""
}

func hasNUL(v any) bool {
	switch t := v.(type) {
	case string:
		return strings.IndexByte(t, 0) >= 0
	case []any:
		for _, e := range t {
			if hasNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range t {
			if strings.IndexByte(k, 0) >= 0 || hasNUL(e) {
				return true
			}
		}
	}
	return false
}

// canonicalJSON returns v re-encoded with sorted member names and no insignificant space, so
// that two encodings of the same value compare equal (used for "the same outcome again",
// SPEC.md §4). Numbers keep their digits.
func canonicalJSON(raw []byte) string {
	if raw == nil {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return string(raw)
	}
	return string(out)
}
