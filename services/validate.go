package services

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits from docs/reference.md §2 and §4. Lengths are in bytes for keys and serialized JSON, and in
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

// ValidateKey checks an idempotency key against docs/reference.md §2: 1–255 bytes of valid UTF-8, no
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

// validateJSON checks a raw JSON value: well-formed, valid UTF-8 (neither database stores
// anything else as text), and an object when wantObject. It returns the compacted form, which
// is what is stored, replayed and measured against size limits. PostgreSQL stores it in a json
// (not jsonb) column, so any value encoding/json accepts round-trips unchanged on both dialects.
func validateJSON(raw json.RawMessage, wantObject bool) (json.RawMessage, string) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, "must be valid JSON"
	}
	out := buf.Bytes()
	if wantObject && (len(out) == 0 || out[0] != '{') {
		return nil, "must be a JSON object"
	}
	if !utf8.Valid(out) {
		return nil, "must be valid UTF-8"
	}
	return out, ""
}

// splitNumber splits a valid JSON number into its sign, integer digits, fraction digits and
// exponent; ok is false if the exponent does not fit in 9 digits.
func splitNumber(n string) (neg bool, intPart, frac string, exp int, ok bool) {
	if neg = strings.HasPrefix(n, "-"); neg {
		n = n[1:]
	}
	mant, e, hasExp := strings.Cut(strings.ToLower(n), "e")
	intPart, frac, _ = strings.Cut(mant, ".")
	if hasExp {
		e = strings.TrimPrefix(e, "+")
		digits := strings.TrimLeft(strings.TrimPrefix(e, "-"), "0")
		if len(digits) > 9 {
			return neg, intPart, frac, 0, false
		}
		if digits != "" {
			exp, _ = strconv.Atoi(digits)
		}
		if strings.HasPrefix(e, "-") {
			exp = -exp
		}
	}
	return neg, intPart, frac, exp, true
}

// canonicalJSON returns v re-encoded with sorted member names and no insignificant space, so
// that two encodings of the same value compare equal (used for "the same outcome again",
// docs/reference.md §4). Numbers are compared by value (1e2, 100 and 100.0 are equal), as jsonb stores
// them normalised: PostgreSQL hands back 100 for a stored 1e2.
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
	out, err := json.Marshal(canonicalNumbers(v))
	if err != nil {
		return string(raw)
	}
	return string(out)
}

// canonicalNumbers replaces every number in v by one spelling of its value: significant digits
// without leading or trailing zeros, then a decimal exponent if not zero ("15e-1" for 1.50).
func canonicalNumbers(v any) any {
	switch t := v.(type) {
	case json.Number:
		neg, intPart, frac, exp, ok := splitNumber(string(t))
		if !ok {
			return t
		}
		digits := strings.TrimLeft(intPart+frac, "0")
		exp -= len(frac)
		for strings.HasSuffix(digits, "0") {
			digits, exp = digits[:len(digits)-1], exp+1
		}
		if digits == "" {
			return json.Number("0")
		}
		if neg {
			digits = "-" + digits
		}
		if exp != 0 {
			digits += "e" + strconv.Itoa(exp)
		}
		return json.Number(digits)
	case []any:
		for i := range t {
			t[i] = canonicalNumbers(t[i])
		}
	case map[string]any:
		for k := range t {
			t[k] = canonicalNumbers(t[k])
		}
	}
	return v
}
