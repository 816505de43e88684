package fibermw_test

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/client/fibermw"
	"github.com/idemgate/idemgate/web/internal/servertest"
)

// idemgateForExample starts a real idemgate server for the example (a service would read its
// URL and API key from its configuration).
func idemgateForExample() (url, apiKey string) {
	s, _, err := servertest.StartServer(dbs.SQLite)
	if err != nil {
		panic(err)
	}
	return s.URL, s.APIKey
}

// A charge endpoint guarded by idemgate: the retry of a request with the same Idempotency-Key
// gets the first response back instead of charging again.
func Example() {
	idemgateURL, apiKey := idemgateForExample()

	idem, err := client.New(idemgateURL, apiKey)
	if err != nil {
		panic(err)
	}
	charges := 0
	app := fiber.New()
	app.Post("/v1/charges", fibermw.New(fibermw.Config{Client: idem}), func(c *fiber.Ctx) error {
		charges++
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"charge": fmt.Sprintf("ch_%d", charges)})
	})

	for range 2 {
		req := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"amount":1200}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		resp, err := app.Test(req, -1)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge":"ch_1"} replayed: false
	// 201 {"charge":"ch_1"} replayed: true
	// charges: 1
}
