package fibermw

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

func TestParseKey(t *testing.T) {
	for in, want := range map[string]string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324":       "8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`:     "8e03978e-40d5-43e8-bc93-6894a57f9324",
		`  "a \"quoted\" \\ key"  `:                  `a "quoted" \ key`,
		"order 5521 ü":                               "order 5521 ü",
		"Key":                                        "Key",
		strings.Repeat("k", MaxKeyBytes):             strings.Repeat("k", MaxKeyBytes),
		`"` + strings.Repeat("k", MaxKeyBytes) + `"`: strings.Repeat("k", MaxKeyBytes),
	} {
		got, err := ParseKey([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "  ", `""`, `" "`, `"abc`, `"a"b`, `"a";p=1`, `"\n"`, `"\x"`, `"ü"`,
		strings.Repeat("k", MaxKeyBytes+1), "a\x01b", "\xff"} {
		_, err := ParseKey([]byte(in))
		require.ErrorIs(t, err, ErrInvalidKey, "%q", in)
	}
}

func TestServerKey(t *testing.T) {
	require.Equal(t, "POST /v1/charges|k-1", serverKey("POST /v1/charges", "k-1"))
	long := strings.Repeat("k", MaxKeyBytes)
	got := serverKey("POST /v1/charges", long)
	require.True(t, strings.HasPrefix(got, "POST /v1/charges#"))
	require.Len(t, got, len("POST /v1/charges#")+64)
	odd := serverKey("POST /a|b", "k")
	require.True(t, strings.HasPrefix(odd, "h:"), "a scope with a separator is hashed: %s", odd)
	require.NotEqual(t, serverKey("POST /a", "b|k"), odd)
}

func TestCanonicalBody(t *testing.T) {
	a := fingerprint(request{Method: "POST", Path: "/x", ContentType: "application/json", Body: []byte(`{"b":[1,2],"a":"\u00fc"}`)})
	b := fingerprint(request{Method: "POST", Path: "/x", ContentType: "application/json; charset=utf-8",
		Body: []byte("{ \"a\": \"ü\",\n \"b\": [1.0, 2] }")})
	require.Equal(t, a, b)
	require.True(t, strings.HasPrefix(a, "sha256:"))
	require.NotEqual(t, a, fingerprint(request{Method: "POST", Path: "/x", ContentType: "text/plain", Body: []byte(`{"b":[1,2],"a":"\u00fc"}`)}))
	require.NotEqual(t, a, fingerprint(request{Method: "PATCH", Path: "/x", ContentType: "application/json", Body: []byte(`{"b":[1,2],"a":"ü"}`)}))
	require.Equal(t,
		fingerprint(request{Method: "POST", Path: "/x", RawQuery: "b=2&a=1"}),
		fingerprint(request{Method: "POST", Path: "/x", RawQuery: "a=1&b=2"}))
}

// FuzzParseKey: no panic; an accepted key satisfies idemgate's own key rule; a key written
// as a structured-field string parses back to itself.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"8e03978e-40d5-43e8-bc93-6894a57f9324", `"abc"`, `"a\"b"`, `"a`, " ", "ü", "\x00", `"\\"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		key, err := ParseKey(v)
		if err != nil {
			require.True(t, errors.Is(err, ErrInvalidKey))
			return
		}
		require.Empty(t, services.ValidateKey(key), "accepted %q, which idemgate refuses", key)
		if isSFStringable(key) {
			quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
			back, err := ParseKey([]byte(quoted))
			require.NoError(t, err)
			require.Equal(t, key, back)
		}
	})
}

func isSFStringable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// FuzzServerKey: every scoped key is a valid idemgate key, and two different (scope, key)
// pairs never share one.
func FuzzServerKey(f *testing.F) {
	f.Add("POST /v1/charges", "k", "POST /v1/charges|", "k")
	f.Add("POST /a", "b|c", "POST /a|b", "c")
	f.Add(strings.Repeat("s", 200), "k", "", strings.Repeat("k", 255))
	f.Fuzz(func(t *testing.T, scope1, key1, scope2, key2 string) {
		if validateKey(key1) != "" || validateKey(key2) != "" {
			return
		}
		k1, k2 := serverKey(scope1, key1), serverKey(scope2, key2)
		require.Empty(t, services.ValidateKey(k1), "%q", k1)
		require.Empty(t, services.ValidateKey(k2), "%q", k2)
		if scope1 != scope2 || key1 != key2 {
			require.NotEqual(t, k1, k2, "(%q, %q) and (%q, %q)", scope1, key1, scope2, key2)
		}
	})
}

func TestCanonicalNumber(t *testing.T) {
	for in, want := range map[string]string{
		"0": "0", "-0": "0", "0.000": "0", "0e5": "0", "-0.0e-3": "0",
		"1": "1e0", "100": "1e2", "1e2": "1e2", "1.00E+2": "1e2", "10e1": "1e2", "0.01": "1e-2",
		"-12.5": "-1.25e1", "9007199254740993": "9.007199254740993e15",
		"9007199254740992": "9.007199254740992e15", "1e400": "1e400", "1E-400": "1e-400",
		"123.456e-3": "1.23456e-1", "0.10000000000000001": "1.0000000000000001e-1",
		"1e99999999999999999999": "1e99999999999999999999",
	} {
		got, ok := canonicalNumber(in)
		require.True(t, ok, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "-", "01", "1.", ".1", "1e", "1e+", "1e-", "+1", "1e+-1", "0x1", "1_0", "NaN"} {
		_, ok := canonicalNumber(in)
		require.False(t, ok, "%q", in)
	}
}

func TestCanonicalJSONRefusesLookAlikes(t *testing.T) {
	for _, body := range []string{
		`{"a":1,"a":2}`,        // duplicate member: parsers disagree which one counts
		`"\ud800"`, `"\udfff"`, // lone surrogates: encoding/json makes both U+FFFD
		"\"\xff\"", // invalid UTF-8
		`{"a":1} {"a":1}`, `[1]x`, `{"a":}`, `nul`,
	} {
		_, err := canonicalJSON([]byte(body))
		require.Error(t, err, body)
	}
	c, err := canonicalJSON([]byte(` {"b" : [ 1.0 , "\u00fc<>" ], "a":{"d":null,"c":true}} `))
	require.NoError(t, err)
	require.Equal(t, `{"a":{"c":true,"d":null},"b":[1e0,"ü<>"]}`, string(c))
}

// FuzzCanonicalBody: canonicalisation is idempotent, and re-indenting a JSON body never
// changes its fingerprint.
func FuzzCanonicalBody(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, `[1e2, 100, 0.5]`, `"\u00fc"`, `{"a":{"b":{}}}`, `not json`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		kind, c := canonicalBody("application/json", body)
		if kind != "json" {
			require.Equal(t, body, c)
			return
		}
		kind2, c2 := canonicalBody("application/json", c)
		require.Equal(t, "json", kind2)
		require.Equal(t, c, c2, "canonical form is a fixed point")
		var indented bytes.Buffer
		if json.Indent(&indented, body, "", "  ") == nil {
			r := request{Method: "POST", Path: "/", ContentType: "application/json"}
			r1, r2 := r, r
			r1.Body, r2.Body = body, indented.Bytes()
			require.Equal(t, fingerprint(r1), fingerprint(r2))
		}
	})
}

// FuzzCanonicalJSONOracle: two JSON documents have the same canonical form exactly when a
// lossless reference reading (sameValue: numbers as exact rationals with math/big, objects as
// maps) finds them equal. A float64 reading would fail this for 9007199254740993 against
// 9007199254740992.
func FuzzCanonicalJSONOracle(f *testing.F) {
	for _, p := range [][2]string{
		{`{"amount":9007199254740993}`, `{"amount":9007199254740992}`},
		{`[1e2]`, `[100.0]`}, {`0.1`, `0.10000000000000001`}, {`-0`, `0`},
		{`{"a":1,"b":2}`, `{"b":2,"a":1}`}, {`"\u00fc"`, `"ü"`}, {`1e400`, `1e401`},
	} {
		f.Add([]byte(p[0]), []byte(p[1]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ca, errA := canonicalJSON(a)
		cb, errB := canonicalJSON(b)
		if errA != nil || errB != nil {
			return
		}
		va, okA := referenceValue(t, a)
		vb, okB := referenceValue(t, b)
		if !okA || !okB {
			return // an exponent too large for the reference to expand
		}
		require.Equal(t, sameValue(va, vb), bytes.Equal(ca, cb), "%s vs %s: canonical %s vs %s", a, b, ca, cb)
	})
}

// referenceValue decodes a document with numbers kept as text; ok is false when a number's
// exponent is too large for math/big to expand cheaply.
func referenceValue(t *testing.T, doc []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v), "canonicalJSON accepted what encoding/json refuses: %q", doc)
	return v, boundedExponents(v)
}

func boundedExponents(v any) bool {
	switch x := v.(type) {
	case json.Number:
		_, exp, ok := strings.Cut(strings.ToLower(string(x)), "e")
		return !ok || len(strings.TrimLeft(exp, "+-0")) <= 3
	case []any:
		for _, e := range x {
			if !boundedExponents(e) {
				return false
			}
		}
	case map[string]any:
		for _, e := range x {
			if !boundedExponents(e) {
				return false
			}
		}
	}
	return true
}

func sameValue(a, b any) bool {
	switch x := a.(type) {
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		rx, okx := new(big.Rat).SetString(string(x))
		ry, oky := new(big.Rat).SetString(string(y))
		return okx && oky && rx.Cmp(ry) == 0
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	default:
		return a == b
	}
}

// FuzzStoredResponse: whatever a handler answers, the record fits idemgate's 64 KiB and
// replays the same status and body byte for byte, unless the body had to be left out.
func FuzzStoredResponse(f *testing.F) {
	f.Add(201, "application/json", []byte(`{"a":"<b>"}`))
	f.Add(200, "application/json", []byte("{\n \"a\": 1\n}\n"))
	f.Add(200, "application/octet-stream", []byte{0, 0xff})
	f.Add(204, "", []byte{})
	f.Add(200, "application/problem+json", []byte(`"\u2028"`))
	f.Fuzz(func(t *testing.T, status int, ctype string, body []byte) {
		if status < 100 || status > 999 {
			return
		}
		headers := map[string][]string{"Content-Type": {ctype}}
		if !utf8.ValidString(ctype) {
			headers = nil
		}
		raw := encodeResponse(status, headers, ctype, body)
		require.LessOrEqual(t, len(raw), 64<<10)
		// What idemgate hands back is its encoding/json rendering of the stored value.
		var stored json.RawMessage
		require.NoError(t, json.Unmarshal(raw, &stored))
		back, err := json.Marshal(struct {
			R json.RawMessage `json:"r"`
		}{stored})
		require.NoError(t, err)
		var env struct {
			R json.RawMessage `json:"r"`
		}
		require.NoError(t, json.Unmarshal(back, &env))
		r, got, ok := decodeResponse(env.R)
		require.True(t, ok)
		require.Equal(t, status, r.Status)
		if !r.BodyOmitted {
			require.Equal(t, string(body), string(got))
		} else {
			require.Equal(t, len(body), r.BodyBytes)
		}
	})
}
