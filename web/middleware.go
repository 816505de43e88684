package web

import (
	"errors"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
)

type ctxKey int

const (
	principalKey ctxKey = iota
)

// apiAuth authenticates the Bearer API key of SPEC.md §4 and stores the tenant's principal for
// principal(c). Failed authentications are counted per client address by lim; a blocked
// address is refused before its key is looked at. Errors: services.ErrUnauthorized,
// services.ErrRateLimited, services.ErrStoreUnavailable.
func apiAuth(auth *services.Auth, lim *authFailureLimiter) fiber.Handler {
	return func(c *fiber.Ctx) error {
		addr := c.IP()
		if wait, blocked := lim.blocked(addr); blocked {
			return refuseRateLimited(c, wait)
		}
		h := c.Get(fiber.HeaderAuthorization)
		scheme, token, ok := strings.Cut(h, " ")
		var p services.Principal
		var err error = services.ErrUnauthorized
		if ok && strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(token) != "" {
			p, err = auth.Authenticate(c.UserContext(), strings.TrimSpace(token))
		}
		if errors.Is(err, services.ErrUnauthorized) {
			// Only refused keys count: a database outage is not the client's failure.
			if lim.fail(addr) {
				lim.log.Warn("API authentication failures rate limited", "request_id", requestID(c), "ip", addr)
			}
			return err
		} else if err != nil {
			return err
		}
		c.Locals(principalKey, p)
		return c.Next()
	}
}

// identityEncoding refuses request bodies with a Content-Encoding: Fiber would inflate them
// behind BodyLimit's back (a 51 KB gzip body became 50 MB in memory), and no client of a JSON
// API this small needs compression on the way in.
func identityEncoding(c *fiber.Ctx) error {
	if enc := c.Get(fiber.HeaderContentEncoding); enc != "" && !strings.EqualFold(enc, "identity") {
		return &services.Error{Code: services.CodeInvalidRequest,
			Message: "Content-Encoding is not supported on requests; send the body uncompressed."}
	}
	return c.Next()
}

// principal returns the caller authenticated by apiAuth. Routes without apiAuth never call it;
// a zero principal (tenant 0) matches nothing, so a wiring mistake fails closed.
func principal(c *fiber.Ctx) services.Principal {
	p, _ := c.Locals(principalKey).(services.Principal)
	return p
}

// requestID returns the request's X-Request-ID as set by the requestid middleware.
func requestID(c *fiber.Ctx) string {
	if v, ok := c.Locals("requestid").(string); ok {
		return v
	}
	return ""
}
