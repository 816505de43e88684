package fibermw

import (
	"bytes"
	"encoding/json"
	"errors"
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

// FuzzCanonicalBody: canonicalisation is idempotent, and re-indenting a JSON body never
// changes its fingerprint.
func FuzzCanonicalBody(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, `[1e2, 100, 0.5]`, `"\u00fc"`, `{"a":{"b":{}}}`, `not json`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		kind, c := canonicalBody("application/json", body)
		if kind != "jcs" {
			require.Equal(t, body, c)
			return
		}
		kind2, c2 := canonicalBody("application/json", c)
		require.Equal(t, "jcs", kind2)
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
