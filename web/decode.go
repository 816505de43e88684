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
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return syntaxProblem(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalidBody("The request body must hold exactly one JSON object.")
	}
	return nil
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
