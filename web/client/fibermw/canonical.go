package fibermw

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"slices"
	"strings"
	"unicode/utf8"
)

// canonicalJSON returns a canonical text of a JSON document, in which two documents compare
// equal exactly when they hold the same values: object members are sorted by name, white
// space is dropped, strings are re-escaped one way, and every number is written as its exact
// decimal value (canonicalNumber), never through a float64.
//
// RFC 8785 (JCS) reads numbers as IEEE-754 doubles, so 9007199254740993 and 9007199254740992
// compare equal there; an amount that differs in its last digit would then replay another
// request's response. Equality here is exact, which is why this is not JCS.
//
// It fails (and the caller falls back to the raw bytes, which only ever makes two requests
// differ, never match) on anything that could make two different documents look alike: text
// that is not JSON, invalid UTF-8, a \u escape of a lone surrogate (encoding/json turns every
// one into U+FFFD), a member name given twice (parsers disagree about which one counts), or
// trailing data.
func canonicalJSON(body []byte) ([]byte, error) {
	if !utf8.Valid(body) || hasSurrogateEscape(body) {
		return nil, errNotCanonical
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var out bytes.Buffer
	if err := writeValue(&out, dec); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errNotCanonical
	}
	return out.Bytes(), nil
}

var errNotCanonical = errors.New("fibermw: body has no canonical JSON form")

// maxDepth bounds nesting, as encoding/json does (10,000), so a hostile body cannot exhaust
// the stack through recursion.
const maxDepth = 10000

func writeValue(out *bytes.Buffer, dec *json.Decoder) error { return writeValueDepth(out, dec, 0) }

func writeValueDepth(out *bytes.Buffer, dec *json.Decoder, depth int) error {
	if depth > maxDepth {
		return errNotCanonical
	}
	tok, err := dec.Token()
	if err != nil {
		return errNotCanonical
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			return writeObject(out, dec, depth)
		case '[':
			out.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := writeValueDepth(out, dec, depth+1); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil { // ']'
				return errNotCanonical
			}
			out.WriteByte(']')
			return nil
		}
		return errNotCanonical
	case string:
		writeString(out, v)
	case json.Number:
		n, ok := canonicalNumber(string(v))
		if !ok {
			return errNotCanonical
		}
		out.WriteString(n)
	case bool:
		if v {
			out.WriteString("true")
		} else {
			out.WriteString("false")
		}
	case nil:
		out.WriteString("null")
	default:
		return errNotCanonical
	}
	return nil
}

func writeObject(out *bytes.Buffer, dec *json.Decoder, depth int) error {
	type member struct {
		name  string
		value []byte
	}
	var members []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return errNotCanonical
		}
		name, ok := tok.(string)
		if !ok {
			return errNotCanonical
		}
		var v bytes.Buffer
		if err := writeValueDepth(&v, dec, depth+1); err != nil {
			return err
		}
		members = append(members, member{name, v.Bytes()})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return errNotCanonical
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.name, b.name) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			if members[i-1].name == m.name {
				return errNotCanonical
			}
			out.WriteByte(',')
		}
		writeString(out, m.name)
		out.WriteByte(':')
		out.Write(m.value)
	}
	out.WriteByte('}')
	return nil
}

// writeString writes s as a JSON string with one fixed escaping (encoding/json's, without
// HTML escaping). s is valid UTF-8 here, so the encoding is exact.
func writeString(out *bytes.Buffer, s string) {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	out.Truncate(out.Len() - 1)
}

// hasSurrogateEscape reports whether body holds a \u escape in the surrogate range D800–DFFF.
// A valid pair also matches; that only costs the canonical form for such bodies (they are
// then compared byte for byte), never a false match.
func hasSurrogateEscape(body []byte) bool {
	for i := 0; i+5 < len(body); i++ {
		if body[i] == '\\' && body[i+1] == 'u' && (body[i+2]|0x20) == 'd' && strings.IndexByte("89abcdefABCDEF", body[i+3]) >= 0 {
			return true
		}
	}
	return false
}

// canonicalNumber returns the exact value of a JSON number as "0" or as
// [-]D[.DDD]e<exponent>: the significant digits without leading or trailing zeros and a
// decimal exponent, so 100, 1e2 and 1.00E+2 all give "1e2", while 9007199254740993 and
// 9007199254740992 stay different. -0 is 0. ok is false when s is not a JSON number.
func canonicalNumber(s string) (string, bool) {
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	mant, exp, hasExp := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, hasFrac := strings.Cut(mant, ".")
	if intPart == "" || !allDigits(intPart) || (len(intPart) > 1 && intPart[0] == '0') ||
		(hasFrac && (frac == "" || !allDigits(frac))) {
		return "", false
	}
	e := new(big.Int)
	if hasExp {
		sign := byte('+')
		if exp != "" && (exp[0] == '+' || exp[0] == '-') {
			sign, exp = exp[0], exp[1:]
		}
		if _, ok := e.SetString(exp, 10); !ok || !allDigits(exp) {
			return "", false
		}
		if sign == '-' {
			e.Neg(e)
		}
	}
	digits := intPart + frac
	// The value is digits × 10^(e − len(frac)); normalise to d.ddd × 10^x.
	trimmed := strings.TrimLeft(digits, "0")
	if trimmed == "" {
		return "0", true
	}
	lead := len(digits) - len(trimmed) // leading zeros dropped
	trimmed = strings.TrimRight(trimmed, "0")
	// Position of the first significant digit relative to the decimal point.
	x := new(big.Int).Sub(e, big.NewInt(int64(len(frac))))
	x.Add(x, big.NewInt(int64(len(digits)-lead-1)))
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	b.WriteByte(trimmed[0])
	if len(trimmed) > 1 {
		b.WriteByte('.')
		b.WriteString(trimmed[1:])
	}
	b.WriteByte('e')
	b.WriteString(x.String())
	return b.String(), true
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// CanonicalJSON is canonicalJSON for other request-identity rules that must agree with the
// middleware's (idemgate mcp-gateway's fingerprint of a tool call's arguments, the server's
// MCP admit tool): the canonical text of the JSON document doc, or an error when doc has none
// (not JSON, invalid UTF-8, a lone surrogate escape, a duplicate member name, trailing data).
// Callers then fingerprint the raw bytes, which can only make two requests differ.
func CanonicalJSON(doc []byte) ([]byte, error) { return canonicalJSON(doc) }
