package web

import (
	"bytes"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
)

// badTextMessage is what a refused parameter is told: the one rule every parameter shares.
const badTextMessage = "must be valid UTF-8 without NUL characters"

// rejectUnstorableParams refuses, with 400 invalid_request, a request whose path, query
// parameters (names or values) or form fields (URL-encoded or multipart) hold a NUL character or
// bytes that are not valid UTF-8, once percent-decoded. Neither database can store or compare
// such text (PostgreSQL refuses it outright, as an error the handlers would turn into 500), and no
// legitimate value needs it: keys are valid UTF-8 without control characters, every other text
// field is valid UTF-8 without NUL, and numbers, ids, times and cursors are ASCII.
//
// It runs for every route, before routing decides anything, so that a new parameter or route is
// covered without a handler remembering a check. API callers get problem+json with the offending
// parameter in errors[].field ("path" for the path); dashboard browsers get the 400 error page.
// JSON request bodies are not looked at here: decodeJSON and the validators check each member.
func rejectUnstorableParams(c *fiber.Ctx) error {
	var fields []services.FieldError
	bad := func(where string, name []byte) {
		field := where
		if n := string(name); storableText(n) && n != "" {
			field = strings.Clone(n)
		}
		fields = append(fields, services.FieldError{Field: field, Message: badTextMessage})
	}
	path := c.Request().URI().PathOriginal()
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	// A path that does not percent-decode is left to the router and handlers (it names no
	// resource and answers 404); only what decodes to unstorable text is refused here.
	if p, err := url.PathUnescape(string(path)); err == nil && !storableText(p) {
		fields = append(fields, services.FieldError{Field: "path", Message: badTextMessage})
	}
	c.Request().URI().QueryArgs().VisitAll(func(k, v []byte) {
		if !storableBytes(k) || !storableBytes(v) {
			bad("query", k)
		}
	})
	ct := c.Get(fiber.HeaderContentType)
	switch {
	case strings.HasPrefix(strings.ToLower(ct), fiber.MIMEApplicationForm):
		c.Request().PostArgs().VisitAll(func(k, v []byte) {
			if !storableBytes(k) || !storableBytes(v) {
				bad("form", k)
			}
		})
	case strings.HasPrefix(strings.ToLower(ct), fiber.MIMEMultipartForm):
		if form, err := c.MultipartForm(); err == nil {
			for k, vs := range form.Value {
				for _, v := range vs {
					if !storableText(k) || !storableText(v) {
						bad("form", []byte(k))
						break
					}
				}
			}
		}
	}
	if len(fields) > 0 {
		return &services.Error{Code: services.CodeInvalidRequest,
			Message: "The request has a parameter that is not valid UTF-8 or contains a NUL character; nothing was done.",
			Fields:  fields}
	}
	return c.Next()
}

// storableText reports whether s can be stored and compared as text on both databases: valid
// UTF-8 without NUL.
func storableText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

func storableBytes(b []byte) bool { return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 }
