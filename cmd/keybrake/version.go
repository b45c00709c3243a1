package main

import (
	"runtime"
	"runtime/debug"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version string

// Version returns the build's version: the -ldflags value, else the module
// version and VCS revision recorded in the binary, else "devel"; then the Go
// version and platform.
func Version() string {
	return buildVersion() + " (" + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}

// buildVersion is Version without the Go version and platform (the version label
// of keybrake_build_info, which has its own goversion label).
func buildVersion() string {
	v := version
	info, ok := debug.ReadBuildInfo()
	if v == "" && ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	if v == "" {
		v = "devel"
		if ok {
			var rev, modified string
			for _, s := range info.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if len(rev) > 12 {
				rev = rev[:12]
			}
			if rev != "" {
				v += "-" + rev
				if modified == "true" {
					v += "-dirty"
				}
			}
		}
	}
	return v
}
