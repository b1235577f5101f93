package settings_test

import (
	"errors"
	"fmt"

	"github.com/meshagent/meshagent/internal/settings"
)

func ExampleResolve() {
	cfg, err := settings.Resolve(settings.Input{
		Env:   []string{`PROXY_CONFIG={"discoveryAddress":"istiod.mesh:15012"}`, "SECRET_TTL=1h"},
		Flags: map[string]string{"status-port": "15021"},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(cfg.CAAddr, cfg.SecretTTL, cfg.StatusPort, cfg.KeyType)
	for _, r := range cfg.Table() {
		if r.Name == "CA_ADDR" || r.Name == "STATUS_PORT" {
			fmt.Printf("%s %s %q\n", r.Name, r.Source, r.Note)
		}
	}

	_, err = settings.Resolve(settings.Input{Env: []string{"CA_PROVIDER=Bogus"}})
	var invalid *settings.InvalidError
	fmt.Println(errors.As(err, &invalid), err)
	// Output:
	// istiod.mesh:15012 1h0m0s 15021 ec-p256
	// CA_ADDR default "from PROXY_CONFIG discoveryAddress"
	// STATUS_PORT flag ""
	// true invalid CA_PROVIDER="Bogus": accepted: Citadel, Linkerd
}
