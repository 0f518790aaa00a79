module github.com/rakelimit/caddy-rakelimit

go 1.26.8
