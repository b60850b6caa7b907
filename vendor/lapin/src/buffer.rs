use crate::parsing::ParsingContext;
use amq_protocol::frame::{BackToTheBuffer, GenError, GenResult, WriteContext};
use futures_io::{AsyncRead, AsyncWrite};
use std::{
    cmp,
    io::{self, IoSlice, IoSliceMut},
    pin::Pin,
    task::{Context, Poll},
};

#[derive(Debug, PartialEq, Clone)]
pub(crate) struct Buffer {
    memory: Vec<u8>,
    capacity: usize,
    position: usize,
    end: usize,
    available_data: usize,
}

pub(crate) struct Checkpoint {
    end: usize,
    backwards: bool,
}

impl Buffer {
    pub(crate) fn with_capacity(capacity: usize) -> Buffer {
        Buffer {
            memory: vec![0; capacity],
            capacity,
            position: 0,
            end: 0,
            available_data: 0,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.position = 0;
        self.end = 0;
        self.available_data = 0;
    }

    pub(crate) fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            end: self.end,
            backwards: true,
        }
    }

    pub(crate) fn rollback(&mut self, checkpoint: Checkpoint) {
        if checkpoint.end == self.end {
            return;
        }
        if checkpoint.backwards {
            if self.end > checkpoint.end {
                self.available_data -= self.end - checkpoint.end;
            } else {
                self.available_data -= self.end + (self.capacity - checkpoint.end);
            }
        } else if self.end > checkpoint.end {
            self.available_data += (self.capacity - self.end) + checkpoint.end;
        } else {
            self.available_data += checkpoint.end - self.end;
        }
        self.end = checkpoint.end;
    }

    pub(crate) fn grow(&mut self, new_size: usize) -> bool {
        if self.capacity >= new_size {
            return false;
        }

        let old_capacity = self.capacity;
        let growth = new_size - old_capacity;

        self.memory.resize(new_size, 0);
        self.capacity = new_size;

        if self.end <= self.position && self.available_data > 0 {
            // We have data and the "tail" was at the beginning of the buffer.
            // We need to move it in the new end.
            let (old, new) = self.memory.split_at_mut(old_capacity);
            if self.end < growth {
                // There is enough room in the new end for this whole "tail".
                new.copy_from_slice(&old[..self.end]);
                self.end += old_capacity;
            } else {
                // Fill the new end with as much data as we can.
                new.copy_from_slice(&old[..growth]);
                // We still have [growth..old_end] to move into [0..new_end]
                // copy_within handles the overlap correctly, if any.
                self.memory.copy_within(growth..self.end, 0);
                // We also update the end pointer to the right location.
                self.end -= growth;
            }
        }

        true
    }

    pub(crate) fn available_data(&self) -> usize {
        self.available_data
    }

    pub(crate) fn available_space(&self) -> usize {
        self.capacity - self.available_data
    }

    pub(crate) fn consume(&mut self, count: usize) -> usize {
        let cnt = cmp::min(count, self.available_data());
        self.position += cnt;
        self.position %= self.capacity;
        self.available_data -= cnt;
        cnt
    }

    pub(crate) fn fill(&mut self, count: usize) -> usize {
        let cnt = cmp::min(count, self.available_space());
        self.end += cnt;
        self.end %= self.capacity;
        self.available_data += cnt;
        cnt
    }

    pub(crate) fn poll_write_to<T: AsyncWrite + ?Sized>(
        &self,
        cx: &mut Context<'_>,
        writer: Pin<&mut T>,
    ) -> Poll<io::Result<usize>> {
        if self.available_data() == 0 {
            Poll::Ready(Ok(0))
        } else if self.end > self.position {
            writer.poll_write(cx, &self.memory[self.position..self.end])
        } else {
            writer.poll_write_vectored(
                cx,
                &[
                    IoSlice::new(&self.memory[self.position..]),
                    IoSlice::new(&self.memory[..self.end]),
                ],
            )
        }
    }

    pub(crate) fn poll_read_from<T: AsyncRead + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        reader: Pin<&mut T>,
    ) -> Poll<io::Result<usize>> {
        if self.available_space() == 0 {
            Poll::Ready(Ok(0))
        } else if self.end >= self.position {
            let (start, end) = self.memory.split_at_mut(self.end);
            reader.poll_read_vectored(
                cx,
                &mut [
                    IoSliceMut::new(&mut *end),
                    IoSliceMut::new(&mut start[..self.position]),
                ][..],
            )
        } else {
            reader.poll_read(cx, &mut self.memory[self.end..self.position])
        }
    }

    pub(crate) fn offset(&self, buf: ParsingContext<'_>) -> usize {
        let dataptr = self.memory[self.position..].as_ptr() as usize;
        let bufptr = buf.as_ptr() as usize;

        if dataptr < bufptr {
            bufptr - dataptr
        } else {
            let start = &self.memory[..0];
            let startptr = start.as_ptr() as usize;
            bufptr + self.capacity - self.position - startptr
        }
    }

    pub(crate) fn parsing_context(&self) -> ParsingContext<'_> {
        if self.available_data() == 0 {
            self.memory[self.end..self.end].into()
        } else if self.end > self.position {
            self.memory[self.position..self.end].into()
        } else {
            [&self.memory[self.position..], &self.memory[..self.end]].into()
        }
    }
}

impl io::Write for &mut Buffer {
    // delay-router's patch: the frame serializer calls this for every field
    // (about 50 times a published message, most of them 1 to 8 bytes). What
    // fits before the end of the memory is copied without the general path's
    // slicing, modulo and second attempt; small fields without a call to
    // `memcpy`. The bytes written and the state after are the general path's.
    #[inline]
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let len = data.len();
        let end = self.end;
        let limit = if end >= self.position {
            self.capacity
        } else {
            self.position
        };
        if len <= self.capacity - self.available_data && len <= limit - end {
            let dst = &mut self.memory[end..end + len];
            match len {
                1 => dst[0] = data[0],
                2 => dst.copy_from_slice(&data[..2]),
                4 => dst.copy_from_slice(&data[..4]),
                8 => dst.copy_from_slice(&data[..8]),
                _ => dst.copy_from_slice(data),
            }
            self.end = if end + len == self.capacity {
                0
            } else {
                end + len
            };
            self.available_data += len;
            return Ok(len);
        }
        self.write_wrapping(data)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    /// The general path of `write`: the data may wrap around the end.
    #[inline(never)]
    fn write_wrapping(&mut self, data: &[u8]) -> io::Result<usize> {
        use io::Write;
        let amt = if self.available_space() == 0 {
            0
        } else if self.end >= self.position {
            let mut space = &mut self.memory[self.end..];
            let mut amt = space.write(data)?;
            if amt == self.capacity - self.end {
                let mut space = &mut self.memory[..self.position];
                amt += space.write(&data[amt..])?;
            }
            amt
        } else {
            let mut space = &mut self.memory[self.end..self.position];
            space.write(data)?
        };
        self.fill(amt);
        Ok(amt)
    }
}

impl BackToTheBuffer for &mut Buffer {
    fn reserve_write_use<
        Tmp,
        Gen: Fn(WriteContext<Self>) -> Result<(WriteContext<Self>, Tmp), GenError>,
        Before: Fn(WriteContext<Self>, Tmp) -> GenResult<Self>,
    >(
        s: WriteContext<Self>,
        reserved: usize,
        generator: &Gen,
        before: &Before,
    ) -> Result<WriteContext<Self>, GenError> {
        if s.write.available_space() < reserved {
            return Err(GenError::BufferTooSmall(
                reserved - s.write.available_space(),
            ));
        }
        let start = s.write.checkpoint();
        s.write.fill(reserved);
        generator(s).and_then(|(s, tmp)| {
            let mut end = s.write.checkpoint();
            end.backwards = false;
            s.write.rollback(start);
            #[allow(clippy::manual_inspect)]
            before(s, tmp).map(|s| {
                s.write.rollback(end);
                s
            })
        })
    }
}

// delay-router's patch: `write`'s fast path leaves the buffer as the general
// path does, for every position, wrap and length (`cargo test -p lapin --lib buffer`).
#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn write_matches_the_general_path() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for capacity in [1, 2, 7, 16, 64] {
            let (mut fast, mut general) =
                (Buffer::with_capacity(capacity), Buffer::with_capacity(capacity));
            for step in 0..20_000 {
                if next(3) == 0 {
                    let n = next(capacity + 1);
                    assert_eq!(fast.consume(n), general.consume(n));
                } else {
                    let data: Vec<u8> = (0..next(10)).map(|i| (step + i) as u8).collect();
                    let a = (&mut fast).write(&data).unwrap();
                    let b = general.write_wrapping(&data).unwrap();
                    assert_eq!(a, b, "capacity {capacity}, step {step}");
                }
                assert_eq!(
                    (fast.position, fast.end, fast.available_data),
                    (general.position, general.end, general.available_data)
                );
                let (mut x, mut y) = (Vec::new(), Vec::new());
                let p = fast.position;
                for (buf, out) in [(&fast, &mut x), (&general, &mut y)] {
                    for k in 0..buf.available_data {
                        out.push(buf.memory[(p + k) % capacity]);
                    }
                }
                assert_eq!(x, y, "capacity {capacity}, step {step}");
            }
        }
    }
}
