//! A packet inside a caller-owned buffer, with room to grow at both ends.

use crate::drop::DropReason;

/// `buf[head..head + len]` is the packet; the bytes before `head` are headroom and
/// those after `head + len` tailroom. Transforms move `head` and `len`; they never
/// allocate.
#[derive(Debug)]
pub struct PacketBuf<'a> {
    buf: &'a mut [u8],
    head: usize,
    len: usize,
}

impl<'a> PacketBuf<'a> {
    /// The packet is `buf[head..head + len]`. Fails with [`DropReason::NoRoom`] if that range
    /// is not inside `buf`.
    pub fn new(buf: &'a mut [u8], head: usize, len: usize) -> Result<Self, DropReason> {
        if head.checked_add(len).is_none_or(|end| end > buf.len()) {
            return Err(DropReason::NoRoom);
        }
        Ok(PacketBuf { buf, head, len })
    }

    pub fn data(&self) -> &[u8] {
        &self.buf[self.head..self.head + self.len]
    }
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.head..self.head + self.len]
    }
    pub fn head(&self) -> usize {
        self.head
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn headroom(&self) -> usize {
        self.head
    }
    pub fn tailroom(&self) -> usize {
        self.buf.len() - self.head - self.len
    }
    /// The whole underlying buffer (headroom and tailroom included).
    pub fn raw(&mut self) -> &mut [u8] {
        self.buf
    }
    /// Point the packet at `buf[head..head + len]`.
    pub fn set(&mut self, head: usize, len: usize) -> Result<(), DropReason> {
        if head.checked_add(len).is_none_or(|end| end > self.buf.len()) {
            return Err(DropReason::NoRoom);
        }
        self.head = head;
        self.len = len;
        Ok(())
    }
}
