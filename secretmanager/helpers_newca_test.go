package secretmanager

import (
	"testing"

	"github.com/meshagent/meshagent/internal/localca"
)

func newCA(t testing.TB, cfg localca.Config) *localca.CA {
	t.Helper()
	ca, err := localca.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}
