package web

import (
	"bytes"

	"github.com/a-h/templ"
	"github.com/gofiber/fiber/v2"
)

// render answers with component as an HTML page with status. The page is rendered into a
// buffer first, so a rendering error becomes a clean error page instead of half a page sent
// with 200.
func render(c *fiber.Ctx, status int, component templ.Component) error {
	var buf bytes.Buffer
	if err := component.Render(c.UserContext(), &buf); err != nil {
		return err
	}
	c.Status(status)
	c.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	return c.Send(buf.Bytes())
}
