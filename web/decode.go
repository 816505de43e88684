package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/idemgate/idemgate/services"
)

// decodeJSON decodes a request body into dst strictly: one JSON object, no unknown members, no
// trailing data, and no type coercion (ttl_seconds "60" is refused, not read as 60). Problems
// come back as services.ErrInvalidRequest with a per-field message where one applies.
func decodeJSON(body []byte, dst any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return invalidBody("The request body must be a JSON object.")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			return invalidBody("The request body must hold exactly one JSON object.")
		}
		return nil
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return invalidBody(fmt.Sprintf("The request body is not valid JSON (at byte %d).", se.Offset))
	case errors.As(err, &te):
		if te.Field == "" {
			return invalidBody("The request body must be a JSON object.")
		}
		return &services.Error{Code: services.CodeInvalidRequest, Message: "The request has invalid fields.",
			Fields: []services.FieldError{{Field: te.Field, Message: "must be " + jsonKind(te.Type.Kind().String())}}}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &services.Error{Code: services.CodeInvalidRequest, Message: "The request has invalid fields.",
			Fields: []services.FieldError{{Field: name, Message: "is not a known field"}}}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalidBody("The request body is truncated JSON.")
	}
	return invalidBody("The request body could not be decoded as JSON.")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int64", "int32":
		return "an integer"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "map", "struct":
		return "a JSON object"
	case "slice":
		return "an array"
	}
	return "of another JSON type"
}

func invalidBody(msg string) error {
	return &services.Error{Code: services.CodeInvalidRequest, Message: msg}
}
