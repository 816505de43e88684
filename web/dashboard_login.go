package web

import (
	"errors"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// loginFailed is the one message for every refused sign-in: it never says whether the
// username exists.
const loginFailed = "Incorrect username or password."

// handleLoginForm is GET /login.
func handleLoginForm() fiber.Handler {
	return func(c *fiber.Ctx) error {
		return render(c, fiber.StatusOK, views.LoginPage(views.LoginProps{
			CSRFToken: csrfToken(c), Next: safeNext(c.Query("next")),
		}))
	}
}

// handleLogin is POST /login: check the password, then start a new session for the operator.
// The session id changes on sign-in (no fixation) and the pre-login CSRF token is dropped with
// the old session, so the signed-in session gets a fresh one.
func handleLogin(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		username := c.FormValue("username")
		password := c.FormValue("password")
		next := safeNext(c.FormValue("next"))
		fail := func(status int, msg string) error {
			return render(c, status, views.LoginPage(views.LoginProps{
				Username: username, Error: msg, CSRFToken: csrfToken(c), Next: next,
			}))
		}
		if username == "" || password == "" {
			return fail(fiber.StatusUnauthorized, "Enter your username and password.")
		}
		if len(username) > 256 || len(password) > 1024 {
			return fail(fiber.StatusUnauthorized, loginFailed)
		}
		op, err := s.auth.Login(c.UserContext(), username, password)
		if errors.Is(err, services.ErrUnauthorized) {
			s.log.InfoContext(c.UserContext(), "dashboard sign-in refused", "ip", c.IP())
			return fail(fiber.StatusUnauthorized, loginFailed)
		} else if err != nil {
			return err
		}
		sess, err := s.sessions.Get(c)
		if err != nil {
			return err
		}
		// Reset: new id, old one deleted from storage, pre-login data (the CSRF token) dropped.
		if err := sess.Reset(); err != nil {
			return err
		}
		sess.Set(sessionOperatorID, op.ID)
		sess.Set(sessionSignedInAt, time.Now().Unix())
		if err := sess.Save(); err != nil {
			return err
		}
		s.log.InfoContext(c.UserContext(), "operator signed in", "operator", op.Username, "ip", c.IP())
		return c.Redirect(nextOrDefault(next), fiber.StatusSeeOther)
	}
}

// handleLogout is POST /logout: delete the session everywhere and go back to the sign-in page.
func handleLogout(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		sess, err := s.sessions.Get(c)
		if err != nil {
			return err
		}
		if err := sess.Destroy(); err != nil {
			return err
		}
		if op := currentOperator(c); op != nil {
			s.log.InfoContext(c.UserContext(), "operator signed out", "operator", op.Username)
		}
		return c.Redirect("/login", fiber.StatusSeeOther)
	}
}
