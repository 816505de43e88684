package web

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web/logging"
)

// problem is an RFC 9457 problem details object with idemgate's extension members: `code`
// (stable, machine-readable; docs/reference.md §4), `errors` (per-field validation messages) and
// `request_id` (the X-Request-ID of the request, to find it in the logs).
type problem struct {
	Type      string         `json:"type"`
	Title     string         `json:"title"`
	Status    int            `json:"status"`
	Detail    string         `json:"detail,omitempty"`
	Code      string         `json:"code"`
	Errors    []problemField `json:"errors,omitempty"`
	RequestID string         `json:"request_id,omitempty"`
	// Operation is the key's uncertain operation on an acquire's 409 outcome_uncertain
	// (docs/reference.md §8), in the shape of GET /v1/operations/{id}.
	Operation *operationDTO `json:"operation,omitempty"`
}

type problemField struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// statusByCode is the one table from domain error code to HTTP status (docs/reference.md §4).
var statusByCode = map[string]int{
	services.CodeInvalidRequest:      http.StatusBadRequest,
	services.CodeUnauthorized:        http.StatusUnauthorized,
	services.CodeFingerprintMismatch: http.StatusUnprocessableEntity,
	services.CodeNotOwner:            http.StatusConflict,
	services.CodeEffectConfirmed:     http.StatusConflict,
	services.CodeOutcomeUncertain:    http.StatusConflict,
	services.CodeKeyNotHeld:          http.StatusNotFound,
	services.CodeInvalidTransition:   http.StatusConflict,
	services.CodeNotFound:            http.StatusNotFound,
	services.CodePayloadTooLarge:     http.StatusRequestEntityTooLarge,
	services.CodeStoreUnavailable:    http.StatusServiceUnavailable,
	services.CodeRateLimited:         http.StatusTooManyRequests,
	services.CodeInternal:            http.StatusInternalServerError,
	services.CodeLeaseExpired:        http.StatusConflict,
	services.CodeTooManyWaiters:      http.StatusServiceUnavailable,
	services.CodeJobIDReused:         http.StatusConflict,
}

// outcomeRoute is the one route where not_owner is 403 rather than 409: docs/reference.md §4 has a wrong
// owner token on an outcome answered 403 "whatever else is wrong", while on release it is a
// conflict with the current hold.
const outcomeRoute = "/v1/operations/:id/outcome"

// renewRoute is POST /v1/operations/{id}/renew, where a wrong owner token is 403 as on an
// outcome (docs/reference.md §8).
const renewRoute = "/operations/:id/renew"

// retryAfterSeconds is sent with 503 store_unavailable.
const retryAfterSeconds = "2"

// toDomainError turns any error that reaches the error handler into a *services.Error. Fiber's
// own errors (unknown route, body too large, wrong method) get matching codes; anything else is
// internal and its text never reaches the client (STYLE.md anti-pattern 5).
//
// bodyLimit is the body limit of the request's route (bodyLimitFor), named in a 413's detail.
func toDomainError(err error, bodyLimit int) (*services.Error, bool) {
	var de *services.Error
	if errors.As(err, &de) {
		return de, false
	}
	var fe *fiber.Error
	if errors.As(err, &fe) {
		if fe.Code < 500 {
			// The client's fault, whatever it was; never logged as an internal error.
			msg := http.StatusText(fe.Code) + "."
			switch fe.Code {
			case fiber.StatusRequestEntityTooLarge:
				return payloadTooLarge(bodyLimit), false
			case fiber.StatusNotFound:
				return &services.Error{Code: services.CodeNotFound, Message: "No such resource."}, false
			case fiber.StatusMethodNotAllowed:
				msg = "Method not allowed on this resource."
			case fiber.StatusForbidden:
				return &services.Error{Code: services.CodeUnauthorized, Message: "Forbidden."}, false
			case fiber.StatusTooManyRequests:
				return &services.Error{Code: services.CodeRateLimited, Message: "Too many requests; retry later."}, false
			}
			return &services.Error{Code: services.CodeInvalidRequest, Message: msg}, false
		}
	}
	if services.IsUnavailable(err) {
		return &services.Error{Code: services.CodeStoreUnavailable, Message: services.ErrStoreUnavailable.Message}, false
	}
	return &services.Error{Code: services.CodeInternal, Message: "Internal error."}, true
}

func statusFor(c *fiber.Ctx, de *services.Error) int { return statusOnRoute(c.Route().Path, de) }

// statusOnRoute is the HTTP status of de answered on route (a Fiber route pattern, such as
// outcomeRoute): statusByCode, but for not_owner on an outcome or a renew.
func statusOnRoute(route string, de *services.Error) int {
	if de.Code == services.CodeNotOwner && (route == outcomeRoute || route == "/v1"+renewRoute) {
		return http.StatusForbidden
	}
	if s, ok := statusByCode[de.Code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// errorHandler is Fiber's ErrorHandler: the single place where errors become responses. API
// and operational routes get problem+json; dashboard routes get an HTML error page.
func (s *Server) errorHandler(c *fiber.Ctx, err error) error {
	de, internal := toDomainError(err, bodyLimitFor(c.Request().URI().PathOriginal()))
	status := statusFor(c, de)
	// Fiber's own errors keep their status (405 stays 405, 429 stays 429).
	var fe *fiber.Error
	if errors.As(err, &fe) && !errors.As(err, new(*services.Error)) && fe.Code != fiber.StatusForbidden {
		status = fe.Code
	}
	if c.GetRespHeader(fiber.HeaderXContentTypeOptions) == "" {
		// Refused by the HTTP server before securityHeaders ran.
		setSecurityHeaders(c)
	}
	rid := requestID(c)
	ctx := c.UserContext()
	traceProblem(ctx, de.Code, status)
	// Errors raised by the HTTP server itself (headers too large, a body over the limit) arrive
	// before any middleware ran: no request id, no observe to log the request.
	refusedEarly := rid == ""
	if refusedEarly {
		rid = uuid.NewString()
		c.Set(fiber.HeaderXRequestID, rid)
		ctx = logging.ContextWithRequestID(ctx, rid)
		defer func() {
			st := c.Response().StatusCode()
			// Only a body over the limit (413) comes with its request line and headers parsed;
			// for the others (431, malformed headers) method and path are Fiber's defaults.
			parsed := st == fiber.StatusRequestEntityTooLarge
			method := "-"
			if parsed {
				method = methodLabel(c.Method())
			}
			s.metrics.requests.WithLabelValues(routeUnmatched, method, strconv.Itoa(st)).Observe(0)
			s.logAccess(ctx, c, routeUnmatched, st, 0, parsed)
		}()
	}
	if internal || status >= 500 {
		s.log.ErrorContext(ctx, "request failed", "method", methodLabel(c.Method()), "route", routeLabel(c, status),
			"status", status, "err", err)
	}
	if status == http.StatusServiceUnavailable {
		c.Set(fiber.HeaderRetryAfter, retryAfterSeconds)
	}
	if status == http.StatusUnauthorized && isAPIPath(c.Path()) {
		c.Set(fiber.HeaderWWWAuthenticate, `Bearer realm="idemgate"`)
	}
	if wantsHTML(c) {
		return s.renderErrorPage(c, status, de.Message)
	}
	c.Status(status)
	return c.JSON(newProblem(status, de, rid), "application/problem+json")
}

// newProblem is the problem document of de answered with status: the body of every
// problem+json response, and the problem of each refused item of an acquire batch.
func newProblem(status int, de *services.Error, rid string) problem {
	p := problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: de.Message,
		Code: de.Code, RequestID: rid}
	for _, f := range de.Fields {
		p.Errors = append(p.Errors, problemField{Field: f.Field, Message: f.Message})
	}
	if de.Operation != nil {
		op := toOperationDTO(de.Operation)
		p.Operation = &op
	}
	return p
}

// payloadTooLarge is the refusal of a body over limit bytes.
func payloadTooLarge(limit int) *services.Error {
	size := strconv.Itoa(limit>>10) + " KiB"
	if limit%(1<<20) == 0 {
		size = strconv.Itoa(limit>>20) + " MiB"
	}
	return &services.Error{Code: services.CodePayloadTooLarge,
		Message: "The request body is larger than " + size + "; nothing was changed."}
}

func isAPIPath(p string) bool { return strings.HasPrefix(p, "/v1/") || p == "/v1" }

// wantsHTML reports whether an error should be an HTML page: a browser (Accept: text/html)
// asking for a dashboard path. Everything else, including requests the HTTP server refused
// before routing, gets problem+json.
func wantsHTML(c *fiber.Ctx) bool {
	p := c.Path()
	if isAPIPath(p) || p == "/readyz" || p == "/healthz" || p == "/metrics" || p == "/openapi.json" {
		return false
	}
	return strings.Contains(c.Get(fiber.HeaderAccept), "text/html")
}
