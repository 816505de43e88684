package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/idemgate/idemgate/services"
)

// decodeJSON decodes a request body into dst (a pointer to a struct with json tags) strictly:
// one JSON object of valid UTF-8, members named exactly as the tags (case-sensitive), each at
// most once, no trailing data, and no type coercion (ttl_seconds "60" is refused, not read as
// 60). encoding/json alone would replace invalid UTF-8 with U+FFFD (so two different keys could
// collide), match names case-insensitively and let a repeated member win silently; a proxy
// that reads the body differently must never disagree with us about what was asked. Problems
// come back as services.ErrInvalidRequest, per field where one applies.
func decodeJSON(body []byte, dst any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return invalidBody("The request body must be a JSON object.")
	}
	if !utf8.Valid(body) {
		return invalidBody("The request body must be valid UTF-8.")
	}
	if err := checkMembers(body, jsonFields(dst)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	err := dec.Decode(dst)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fieldError(te.Field, "must be "+jsonKind(te.Type.Kind()))
	}
	return invalidBody("The request body could not be decoded as JSON.")
}

// checkMembers walks the top level of body: it must be one object whose member names are all
// in allowed, none repeated, followed by nothing but white space.
func checkMembers(body []byte, allowed map[string]bool) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return syntaxProblem(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return invalidBody("The request body must be a JSON object.")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxProblem(err)
		}
		name := tok.(string) // inside an object, encoding/json only yields string names here
		switch {
		case !allowed[name]:
			return fieldError(name, "is not a known field (names are case-sensitive)")
		case seen[name]:
			return fieldError(name, "appears more than once")
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return syntaxProblem(err)
		}
		if len(skip) > 0 && skip[0] == '"' && hasLoneSurrogate(skip) {
			return fieldError(name, `must not contain a lone UTF-16 surrogate escape (\uD800–\uDFFF without its pair)`)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return syntaxProblem(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalidBody("The request body must hold exactly one JSON object.")
	}
	return nil
}

// hasLoneSurrogate reports whether the JSON string literal raw (quotes included, already valid
// JSON) has a \u escape of a UTF-16 surrogate that is not part of a high+low pair.
// encoding/json decodes such an escape to U+FFFD, so "k\ud800" and "k\udfff" would both
// become "k\ufffd": different keys from the client's point of view, one key once stored.
// Top-level string members are refused for it; nested values (metadata, response) are stored
// as raw JSON and keep their escapes.
func hasLoneSurrogate(raw []byte) bool {
	hex4 := func(i int) (rune, bool) { // the 4 hex digits at raw[i:i+4]
		if i+4 > len(raw) {
			return 0, false
		}
		var v rune
		for _, c := range raw[i : i+4] {
			switch {
			case c >= '0' && c <= '9':
				v = v<<4 | rune(c-'0')
			case c >= 'a' && c <= 'f':
				v = v<<4 | rune(c-'a'+10)
			case c >= 'A' && c <= 'F':
				v = v<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return v, true
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' || i+1 >= len(raw) {
			continue
		}
		if raw[i+1] != 'u' {
			i++ // a two-character escape such as \" or \\
			continue
		}
		v, ok := hex4(i + 2)
		if !ok {
			return false // not valid JSON; the decoder reports it
		}
		i += 5
		switch {
		case v >= 0xDC00 && v <= 0xDFFF:
			return true // a low surrogate with no high one before it
		case v >= 0xD800 && v <= 0xDBFF:
			if i+2 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
				return true
			}
			lo, ok := hex4(i + 3)
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 6
		}
	}
	return false
}

func syntaxProblem(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return invalidBody(fmt.Sprintf("The request body is not valid JSON (at byte %d).", se.Offset))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return invalidBody("The request body is truncated JSON.")
	}
	return invalidBody("The request body is not valid JSON.")
}

var fieldCache sync.Map // reflect.Type -> map[string]bool

// jsonFields returns the json member names of the struct dst points to.
func jsonFields(dst any) map[string]bool {
	t := reflect.TypeOf(dst).Elem()
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]bool)
	}
	m := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			m[name] = true
		}
	}
	fieldCache.Store(t, m)
	return m
}

func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Map, reflect.Struct:
		return "a JSON object"
	case reflect.Slice:
		return "an array"
	}
	return "of another JSON type"
}

func fieldError(field, msg string) error {
	return &services.Error{Code: services.CodeInvalidRequest, Message: "The request has invalid fields.",
		Fields: []services.FieldError{{Field: field, Message: msg}}}
}

func invalidBody(msg string) error {
	return &services.Error{Code: services.CodeInvalidRequest, Message: msg}
}
