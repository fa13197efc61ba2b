// Package rlsconfig reads the configuration of Envoy's reference rate limit
// service (envoyproxy/ratelimit) as that project documents it, and answers
// which limit applies to a descriptor, so edgeguard's limiter can serve
// Envoy's rate limit service API with the same documents.
//
// A document names a domain and a tree of descriptors:
//
//	domain: api
//	descriptors:
//	  - key: remote_address          # any value: one counter per address
//	    rate_limit: {unit: minute, requests_per_unit: 60}
//	  - key: path
//	    value: /login                # this value only
//	    rate_limit: {unit: second, requests_per_unit: 5}
//	  - key: path
//	    value: /static/*             # prefix (or any '*' pattern) of the value
//	    rate_limit: {unlimited: true}
//
// Matching follows the reference (GetLimit): the request's entries are
// walked in order down the tree; at each level an entry matches the
// descriptor with its key and value, else the first wildcard pattern (in
// document order) its value fits, else the descriptor with its key and no
// value. A limit applies only when the walk ends on the request's last entry.
// As in the reference, key and value are compared joined, as the string
// key_value (StrictMatch compares them apart).
//
// Everything the reference accepts is read: rate_limit (unit,
// requests_per_unit, unlimited, name, replaces), shadow_mode, quota_mode,
// share_threshold, detailed_metric and value_to_metric (both accepted; the
// metrics keep bounded labels, so they change nothing), and metadata
// (accepted and ignored: response dynamic metadata is not served).
//
// Extensions (edgeguard only; the reference refuses them as unknown keys),
// inside rate_limit:
//
//	algorithm: sliding_window   # fixed_window (default, the reference's), sliding_log,
//	                            # sliding_window, token_bucket, leaky_bucket, concurrency
//	window: 90s                 # any window instead of unit (a Go duration)
//	burst: 20                   # a bucket's capacity (token_bucket, leaky_bucket)
//
// Problems are reported all at once (errors.Join), each naming the file and
// line, the descriptor's path (domain.key_value.key as the reference names
// it) and the field.
package rlsconfig
