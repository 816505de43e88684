package web

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
)

// parseWait reads the wait query parameter of GET /v1/operations/{id} (docs/reference.md §8):
// whole or decimal seconds ("30", "2.5") or a Go duration with a unit ("30s", "500ms", "1m"),
// from 0 to services.MaxWait. "" is no wait. Errors: services.ErrInvalidRequest with field wait.
func parseWait(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	bad := &services.Error{Code: services.CodeInvalidRequest, Message: "The request has invalid fields.",
		Fields: []services.FieldError{{Field: "wait",
			Message: fmt.Sprintf("must be seconds (30) or a duration (30s, 500ms) from 0 to %s", services.MaxWait)}}}
	var d time.Duration
	if strings.TrimLeft(s, "0123456789.") == "" {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || secs > services.MaxWait.Seconds() {
			return 0, bad
		}
		d = time.Duration(secs * float64(time.Second))
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil || strings.HasPrefix(s, "+") {
			return 0, bad
		}
	}
	if d < 0 || d > services.MaxWait {
		return 0, bad
	}
	return d, nil
}

// waitContext is the context a waiting request waits under: not the request's store deadline
// (the wait is longer than any database call may be; each of the Awaiter's reads has its own),
// but ended when the client disconnects or the server shuts down (fasthttp's request context
// ends then), so a waiter is never left behind its client. The CancelFunc must be called.
func waitContext(c *fiber.Ctx) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(c.UserContext()))
	gone := peerGone(c.Context().Conn(), ctx.Done())
	shutdown := c.Context().Done()
	go func() {
		select {
		case <-gone:
		case <-shutdown:
		case <-ctx.Done():
		}
		cancel()
	}()
	return ctx, cancel
}
