// Package config is the edge's settings: every flag, its EDGEGUARD_
// variable and its key in the --config file (config.go, configfile.go),
// read over the defaults and validated together (Validate reports every
// problem at once); the edge's command line conventions (ParseCommandLine:
// --help, exit codes) and its JSON logger (NewLogger).
package config
