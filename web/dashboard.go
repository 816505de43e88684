package web

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/csrf"
	"github.com/gofiber/fiber/v2/middleware/limiter"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/static"
	"github.com/idemgate/idemgate/views"
)

// Dashboard session and CSRF settings (docs/reference.md §5).
const (
	// sessionIdle is how long a session lives without a request; every page view extends it.
	sessionIdle = 12 * time.Hour
	// sessionMaxAge bounds a session however active it is; then the operator signs in again.
	sessionMaxAge = 7 * 24 * time.Hour

	sessionOperatorID = "operator_id" // int64, the signed-in account
	sessionSignedInAt = "signed_in_at"

	csrfCookie = "idemgate_csrf"
	csrfField  = "_csrf"

	// Failed sign-ins allowed per client address per loginWindow.
	loginAttempts = 10
	loginWindow   = time.Minute
)

// contentSecurityPolicy allows only same-origin resources and no inline script or style; the
// dashboard's script and stylesheet are static files.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"

type dashKey int

const (
	operatorKey dashKey = iota
	csrfTokenKey
)

// renderErrorPage answers a dashboard request that failed, with a message safe to show.
func (s *Server) renderErrorPage(c *fiber.Ctx, status int, msg string) error {
	setPageHeaders(c)
	title := http.StatusText(status)
	if title == "" {
		title = "Error"
	}
	props := views.ErrorProps{Status: status, Title: title, Message: msg, RequestID: requestID(c)}
	// Signed in (and past the CSRF middleware, so the sign-out form works): the site's frame.
	if op := currentOperator(c); op != nil && csrfToken(c) != "" {
		if nav, err := s.navFor(c, op, ""); err == nil {
			props.Nav = &nav
		}
	}
	err := render(c, status, views.ErrorPage(props))
	if err != nil {
		s.log.ErrorContext(c.UserContext(), "render error page", "err", err)
		c.Status(status)
		return c.SendString(msg)
	}
	return nil
}

// setPageHeaders sets the security headers of every dashboard page. Pages show tenants' data,
// so no cache may keep them (and Back after sign-out shows nothing).
func setPageHeaders(c *fiber.Ctx) {
	c.Set(fiber.HeaderContentSecurityPolicy, contentSecurityPolicy)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	c.Set(fiber.HeaderReferrerPolicy, "same-origin")
	c.Set(fiber.HeaderXFrameOptions, "DENY")
	c.Set("Cross-Origin-Opener-Policy", "same-origin")
	c.Set(fiber.HeaderCacheControl, "no-store")
}

func pageHeaders(c *fiber.Ctx) error {
	setPageHeaders(c)
	return c.Next()
}

// staticHeaders answers only for known assets and sets their caching: a URL carrying the
// asset's current content hash (static.URL) is immutable for a year; any other is cached
// briefly.
func staticHeaders(c *fiber.Ctx) error {
	name := strings.TrimPrefix(c.Path(), strings.TrimSuffix(static.Prefix, "/"))
	name = strings.TrimPrefix(name, "/")
	v := static.Version(name)
	if v == "" {
		return fiber.ErrNotFound
	}
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	if c.Query("v") == v {
		c.Set(fiber.HeaderCacheControl, "public, max-age=31536000, immutable")
	} else {
		c.Set(fiber.HeaderCacheControl, "public, max-age=300")
	}
	return c.Next()
}

// csrfMiddleware protects every dashboard form: the token lives in the server-side session and
// in a cookie, and a POST must send it back in the _csrf form field.
func (s *Server) csrfMiddleware() fiber.Handler {
	return csrf.New(csrf.Config{
		KeyLookup:      "form:" + csrfField,
		CookieName:     csrfCookie,
		CookiePath:     "/",
		CookieSecure:   s.secure,
		CookieHTTPOnly: true,
		CookieSameSite: fiber.CookieSameSiteLaxMode,
		Expiration:     sessionIdle,
		Session:        s.sessions,
		ContextKey:     csrfTokenKey,
		ErrorHandler: func(c *fiber.Ctx, err error) error {
			s.log.InfoContext(c.UserContext(), "dashboard form refused", "route", c.Route().Path, "reason", err)
			return s.renderErrorPage(c, fiber.StatusForbidden,
				"This form has expired or did not come from this dashboard, so nothing was done. Go back, reload the page and try again.")
		},
	})
}

// loginLimiter limits failed sign-ins per client address. Successful ones are not counted,
// so an operator who signs in often is never locked out. The count is per process.
func (s *Server) loginLimiter() fiber.Handler {
	return limiter.New(limiter.Config{
		Max:                    loginAttempts,
		Expiration:             loginWindow,
		KeyGenerator:           func(c *fiber.Ctx) string { return c.IP() },
		SkipSuccessfulRequests: true,
		LimitReached: func(c *fiber.Ctx) error {
			s.log.WarnContext(c.UserContext(), "dashboard sign-in rate limited", "ip", c.IP())
			// The limiter has set Retry-After.
			return s.renderErrorPage(c, fiber.StatusTooManyRequests,
				"Too many failed sign-in attempts from your address. Wait a minute, then try again.")
		},
	})
}

// requireOperator lets signed-in operators through and stores their account for
// currentOperator; anyone else is redirected to the sign-in page.
func (s *Server) requireOperator(c *fiber.Ctx) error {
	op, err := s.sessionOperator(c)
	if err != nil {
		return err
	}
	if op == nil {
		return redirectToLogin(c)
	}
	c.Locals(operatorKey, op)
	return c.Next()
}

// redirectSignedIn sends an operator who is already signed in from the sign-in page onwards.
func (s *Server) redirectSignedIn(c *fiber.Ctx) error {
	if op, err := s.sessionOperator(c); err == nil && op != nil {
		return c.Redirect(nextOrDefault(c.Query("next")), fiber.StatusSeeOther)
	}
	return c.Next()
}

// sessionOperator returns the operator signed in to the request's session, or nil. The account
// is read afresh on each request, so a deleted account or a changed role or tenant takes effect
// at once. Errors: ErrStoreUnavailable.
func (s *Server) sessionOperator(c *fiber.Ctx) (*services.OperatorAccount, error) {
	sess, err := s.sessions.Get(c)
	if err != nil {
		if services.IsUnavailable(err) {
			return nil, services.ErrStoreUnavailable
		}
		// Undecodable session data: treat as signed out rather than failing forever.
		s.log.WarnContext(c.UserContext(), "unreadable dashboard session", "err", err)
		return nil, nil
	}
	id, ok := sess.Get(sessionOperatorID).(int64)
	if !ok {
		return nil, nil
	}
	at, _ := sess.Get(sessionSignedInAt).(int64)
	if time.Since(time.Unix(at, 0)) > sessionMaxAge {
		_ = sess.Destroy()
		return nil, nil
	}
	op, err := s.auth.Operator(c.UserContext(), id)
	if errors.Is(err, services.ErrNotFound) {
		_ = sess.Destroy()
		return nil, nil
	}
	return op, err
}

// currentOperator returns the account requireOperator stored, or nil on a route without it.
func currentOperator(c *fiber.Ctx) *services.OperatorAccount {
	op, _ := c.Locals(operatorKey).(*services.OperatorAccount)
	return op
}

// csrfToken returns the CSRF token for the forms of the page being rendered.
func csrfToken(c *fiber.Ctx) string {
	t, _ := c.Locals(csrfTokenKey).(string)
	return t
}

// redirectToLogin sends the browser to the sign-in page, remembering the page it asked for.
func redirectToLogin(c *fiber.Ctx) error {
	loc := "/login"
	if c.Method() == fiber.MethodGet && c.Path() != "/" {
		if next := safeNext(c.OriginalURL()); next != "" {
			loc += "?next=" + url.QueryEscape(next)
		}
	}
	return c.Redirect(loc, fiber.StatusSeeOther)
}

// safeNext returns raw if it is a path on this site to return to after signing in, else "".
// Anything that could leave the site ("//host", "/\host", a scheme) is refused.
func safeNext(raw string) string {
	if raw == "" || len(raw) > 2048 || !strings.HasPrefix(raw, "/") || strings.HasPrefix(raw, "//") {
		return ""
	}
	for _, r := range raw {
		if r < 0x20 || r == 0x7f || r == '\\' {
			return ""
		}
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return ""
	}
	if u.Path == "/login" || u.Path == "/logout" {
		return ""
	}
	return strings.Clone(raw)
}

// nextOrDefault is where sign-in lands: the safe next page, else the Overview.
func nextOrDefault(raw string) string {
	if n := safeNext(raw); n != "" {
		return n
	}
	return "/"
}

// navFor builds the page frame's view of the signed-in operator.
func (s *Server) navFor(c *fiber.Ctx, op *services.OperatorAccount, active string) (views.Nav, error) {
	scope := "All tenants"
	if !services.SeesAllTenants(op) {
		name, err := s.dash.TenantName(c.UserContext(), *op.TenantID)
		if err != nil {
			return views.Nav{}, err
		}
		scope = "Tenant " + name
	}
	return views.Nav{Username: op.Username, Role: op.Role, Scope: scope, CSRFToken: csrfToken(c), Active: active,
		ShowAdmin: services.IsGlobalAdmin(op)}, nil
}
