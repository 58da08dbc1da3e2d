//! The codec of every generated gRPC service and client: prost's, with a
//! smaller first buffer per stream.
//!
//! tonic gives each stream an encode buffer (and each received stream a
//! decode buffer) of 8 KiB up front, held for as long as the stream lasts.
//! A control plane with thousands of attached `AttachRun` streams, most of
//! them idle between a model's chunks, held that much per stream for
//! nothing. Here a stream starts at 1 KiB and its buffer grows with the
//! messages it carries (a busy stream's as before: tonic reserves what a
//! message needs and keeps it).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// A stream's first encode or decode buffer.
const FIRST_BUFFER: usize = 1024;
/// Encoded bytes an encoder gathers before it hands them on (tonic's).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`FIRST_BUFFER`]; named by the generated code
/// (`shared/build.rs`).
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(FIRST_BUFFER, YIELD_THRESHOLD)
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
