package main

import (
	"fmt"
	"runtime"
)

// version is set at build time: -ldflags "-X main.version=...".
var version = "dev"

func versionString() string {
	return fmt.Sprintf("meshagent %s (%s %s/%s)", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
