//! Prints the OpenAPI document the server serves: `cargo run -q -p gpunet-server --example dump_openapi > openapi.json`.

fn main() {
    println!("{}", serde_json::to_string_pretty(&gpunet_server::openapi::document()).unwrap());
}
