//! The egress proxy's reader of a tunnel's first bytes (a CONNECT's
//! ClientHello, whose server name must name the CONNECT target): any bytes,
//! however they arrive, are not TLS, a partial hello, a server name, or
//! malformed, never a panic; a name it reads fits itself as a target; and
//! more bytes never turn a malformed hello into a readable one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_agent::egress::tls::{Hello, MAX_HELLO, client_hello, fits};

fuzz_target!(|input: (Vec<u8>, u16)| {
    let (bytes, cut) = input;
    let whole = client_hello(&bytes);
    if let Hello::ServerName(Some(name)) = &whole {
        if !name.contains(['[', ']']) {
            assert!(fits(Some(name), name), "{name:?}");
        }
    }
    if bytes.len() > MAX_HELLO && bytes.first() == Some(&0x16) {
        assert!(matches!(whole, Hello::Malformed(_)));
    }
    let prefix = &bytes[..(cut as usize).min(bytes.len())];
    if matches!(client_hello(prefix), Hello::Malformed(_)) && prefix.len() <= MAX_HELLO {
        assert!(matches!(whole, Hello::Malformed(_)), "{prefix:?} malformed but {bytes:?} not");
    }
});
