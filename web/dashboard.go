package web

import (
	"github.com/gofiber/fiber/v2"
)

// dashboardRoutes registers the operator dashboard (SPEC.md §5).
func (s *Server) dashboardRoutes() {}

// renderErrorPage answers a dashboard request that failed.
func (s *Server) renderErrorPage(c *fiber.Ctx, status int, msg string) error {
	c.Status(status)
	return c.SendString(msg)
}
