package fibermw

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemgate/idemgate/web/client"
)

// MaxKeyBytes is the longest Idempotency-Key value accepted, in bytes after unquoting: the
// same 255 bytes as an idemgate key (docs/reference.md §2), so a key valid for one is valid for the
// other.
const MaxKeyBytes = client.MaxKeyBytes

// ErrInvalidKey is wrapped by every error of ParseKey.
var ErrInvalidKey = errors.New("invalid Idempotency-Key")

// ParseKey reads the value of an Idempotency-Key header field and returns the key.
//
// The IETF draft (draft-ietf-httpapi-idempotency-key-header §2) makes the field a Structured
// Field String (RFC 8941 §3.3.3): `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, with `\"` and `\\`
// as the only escapes and printable ASCII inside. Many clients (Stripe's among them) send the
// bare value instead, so a value that does not start with a double quote is taken as it is,
// byte for byte. Either way the key must then satisfy idemgate's key rules (docs/reference.md §2): 1–255
// bytes of valid UTF-8, no control characters, not all white space. It is compared byte-exact:
// no case folding, no Unicode normalisation; only the optional white space around a field
// value (RFC 9110 §5.5) is removed. Errors wrap ErrInvalidKey and say what is wrong.
func ParseKey(value []byte) (string, error) {
	v := strings.Trim(string(value), " \t")
	if strings.HasPrefix(v, `"`) {
		s, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		v = s
	}
	if msg := validateKey(v); msg != "" {
		return "", fmt.Errorf("%w: %s", ErrInvalidKey, msg)
	}
	return v, nil
}

// parseSFString parses an RFC 8941 sf-string that must make up the whole of v. Parameters are
// not accepted: the draft defines none.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf(`%w: in a quoted key only \" and \\ are escapes`, ErrInvalidKey)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: nothing may follow the closing quote", ErrInvalidKey)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: a quoted key may contain only printable ASCII (RFC 8941 §3.3.3)", ErrInvalidKey)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: the closing quote is missing", ErrInvalidKey)
}

// validateKey applies idemgate's key rules (docs/reference.md §2; services.ValidateKey on the server).
func validateKey(key string) string {
	switch {
	case key == "":
		return "must not be empty"
	case len(key) > MaxKeyBytes:
		return fmt.Sprintf("must be at most %d bytes", MaxKeyBytes)
	case !utf8.ValidString(key):
		return "must be valid UTF-8"
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return "must not contain control characters"
	case strings.TrimFunc(key, unicode.IsSpace) == "":
		return "must not be all white space"
	}
	return ""
}

// maxScopeBytes is the longest scope kept readable in idemgate's key; a longer one (or one
// with a character outside printable ASCII, or a separator) is replaced by its digest.
const maxScopeBytes = 96

// serverKey is the idemgate key of an Idempotency-Key in scope: "<scope>|<key>", e.g.
// "POST /v1/charges|8e03978e-…", readable on the dashboard. The scope never contains '|' or
// '#' (else it is replaced by "h:" and 32 hex digits of its SHA-256), so the first of them
// ends it and different (scope, key) pairs never share a key. When the result would pass
// idemgate's 255 bytes, the key part is replaced by its SHA-256: "<scope>#<64 hex digits>".
func serverKey(scope, key string) string {
	if !readableScope(scope) {
		sum := sha256.Sum256([]byte(scope))
		scope = "h:" + hex.EncodeToString(sum[:16])
	}
	if k := scope + "|" + key; len(k) <= client.MaxKeyBytes {
		return k
	}
	sum := sha256.Sum256([]byte(key))
	return scope + "#" + hex.EncodeToString(sum[:])
}

func readableScope(s string) bool {
	if len(s) > maxScopeBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '|' || c == '#' {
			return false
		}
	}
	return true
}
