// Command goclient is the Go program a task of edge/host's client tests
// runs: net/http's default client, configured by nothing but the
// environment (HTTPS_PROXY when set, SSL_CERT_FILE), as most Go tools are.
// It GETs its one argument with "Authorization: Bearer $API_TOKEN" and
// prints the answer's body; an error or a status other than 200 exits 1.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	if err := get(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func get(url string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+os.Getenv("API_TOKEN"))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if _, err := io.Copy(os.Stdout, res.Body); err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", res.Status)
	}
	return nil
}
