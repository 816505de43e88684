// Command run checks a service against the Idempotency-Key draft's conformance suite
// (e2e/conformance/README.md says what the service must offer):
//
//	go run ./e2e/conformance/run -base http://127.0.0.1:3000
//
// It prints one line per case and exits 1 when a MUST or SHOULD case fails, 2 on bad usage.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/idemgate/idemgate/e2e/conformance"
)

func main() {
	base := flag.String("base", "", "the service's base URL, e.g. http://127.0.0.1:3000 (required)")
	flag.Parse()
	if *base == "" {
		fmt.Fprintln(os.Stderr, "usage: run -base URL")
		os.Exit(2)
	}
	cases, err := conformance.Cases()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	results := conformance.Run(context.Background(), *base, &http.Client{Timeout: 30 * time.Second}, cases)
	fmt.Print(conformance.Report(results))
	for _, r := range results {
		if !r.Pass && r.Case.Level != conformance.LevelOpen {
			os.Exit(1)
		}
	}
}
