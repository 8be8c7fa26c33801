#pragma once
// A vector of trivially copyable values that keeps its first N elements inside the object, so
// the short lists the engine handles all the time (shapes, strides, dims) cost no heap
// allocation. Past N elements it moves to the heap like std::vector. The interface is the part
// of std::vector's that the engine uses, with the same meaning.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <stdexcept>
#include <type_traits>

namespace autograd {

template <class T, std::size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>, "SmallVector holds trivially copyable values only");
  static_assert(N > 0);

 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using pointer = T*;
  using const_pointer = const T*;
  using iterator = T*;
  using const_iterator = const T*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  SmallVector() noexcept = default;
  explicit SmallVector(size_type n) { resize(n); }
  SmallVector(size_type n, const T& value) { assign(n, value); }
  SmallVector(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  SmallVector(It first, It last) {
    assign(first, last);
  }
  SmallVector(const SmallVector& o) { assign(o.begin(), o.end()); }
  SmallVector(SmallVector&& o) noexcept { take(o); }
  SmallVector& operator=(const SmallVector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this != &o) {
      free_heap();
      take(o);
    }
    return *this;
  }
  SmallVector& operator=(std::initializer_list<T> values) {
    assign(values.begin(), values.end());
    return *this;
  }
  ~SmallVector() { free_heap(); }

  // ---- size ----
  size_type size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_type capacity() const noexcept { return capacity_; }
  void reserve(size_type n) {
    if (n > capacity_) grow_to(n);
  }
  void clear() noexcept { size_ = 0; }
  void resize(size_type n) { resize(n, T{}); }
  void resize(size_type n, const T& value) {
    reserve(n);
    std::fill(data_ + size_, data_ + std::max(n, size_), value);
    size_ = n;
  }

  // ---- access ----
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  T& operator[](size_type i) noexcept { return data_[i]; }
  const T& operator[](size_type i) const noexcept { return data_[i]; }
  T& at(size_type i) {
    if (i >= size_) throw std::out_of_range("SmallVector::at: index out of range");
    return data_[i];
  }
  const T& at(size_type i) const {
    if (i >= size_) throw std::out_of_range("SmallVector::at: index out of range");
    return data_[i];
  }
  T& front() noexcept { return data_[0]; }
  const T& front() const noexcept { return data_[0]; }
  T& back() noexcept { return data_[size_ - 1]; }
  const T& back() const noexcept { return data_[size_ - 1]; }

  iterator begin() noexcept { return data_; }
  iterator end() noexcept { return data_ + size_; }
  const_iterator begin() const noexcept { return data_; }
  const_iterator end() const noexcept { return data_ + size_; }
  const_iterator cbegin() const noexcept { return data_; }
  const_iterator cend() const noexcept { return data_ + size_; }
  reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }

  // ---- modifiers ----
  void assign(size_type n, const T& value) {
    size_ = 0;
    resize(n, value);
  }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  void assign(It first, It last) {
    if constexpr (std::is_base_of_v<std::forward_iterator_tag, typename std::iterator_traits<It>::iterator_category>) {
      const auto n = static_cast<size_type>(std::distance(first, last));
      size_ = 0;
      reserve(n);
      std::copy(first, last, data_);
      size_ = n;
    } else {
      size_ = 0;
      for (; first != last; ++first) push_back(*first);
    }
  }
  void push_back(const T& value) {
    if (size_ == capacity_) {
      const T copy = value;  // value may live in this vector
      grow_to(2 * capacity_);
      data_[size_++] = copy;
      return;
    }
    data_[size_++] = value;
  }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    push_back(T(std::forward<Args>(args)...));
    return back();
  }
  void pop_back() noexcept { --size_; }

  iterator insert(const_iterator pos, const T& value) { return insert(pos, size_type{1}, value); }
  iterator insert(const_iterator pos, size_type n, const T& value) {
    const T copy = value;
    const size_type at = make_gap(pos, n);
    std::fill(data_ + at, data_ + at + n, copy);
    return data_ + at;
  }
  iterator insert(const_iterator pos, std::initializer_list<T> values) {
    return insert(pos, values.begin(), values.end());
  }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  iterator insert(const_iterator pos, It first, It last) {
    const SmallVector tmp(first, last);  // the source may alias this vector
    const size_type at = make_gap(pos, tmp.size());
    std::copy(tmp.begin(), tmp.end(), data_ + at);
    return data_ + at;
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const auto at = static_cast<size_type>(first - data_);
    const auto n = static_cast<size_type>(last - first);
    std::copy(data_ + at + n, data_ + size_, data_ + at);
    size_ -= n;
    return data_ + at;
  }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const SmallVector& a, const SmallVector& b) { return !(a == b); }
  friend bool operator<(const SmallVector& a, const SmallVector& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool on_heap() const noexcept { return data_ != inline_; }
  void free_heap() noexcept {
    if (on_heap()) ::operator delete(data_);
    data_ = inline_;
    capacity_ = N;
  }
  // Out of line: the rare path stays out of callers' code (and out of GCC 12's -Warray-bounds
  // analysis, which misreads the inline buffer after inlining it).
  [[gnu::noinline]] void grow_to(size_type n) {
    n = std::max(n, 2 * capacity_);
    T* p = static_cast<T*>(::operator new(n * sizeof(T)));
    std::copy(data_, data_ + size_, p);
    if (on_heap()) ::operator delete(data_);
    data_ = p;
    capacity_ = n;
  }
  void take(SmallVector& o) noexcept {
    if (o.on_heap()) {
      data_ = o.data_;
      capacity_ = o.capacity_;
    } else {
      data_ = inline_;
      capacity_ = N;
      std::copy(o.inline_, o.inline_ + o.size_, inline_);
    }
    size_ = o.size_;
    o.data_ = o.inline_;
    o.capacity_ = N;
    o.size_ = 0;
  }
  // Opens n slots at pos; returns the index of the first.
  size_type make_gap(const_iterator pos, size_type n) {
    const auto at = static_cast<size_type>(pos - data_);
    reserve(size_ + n);
    std::copy_backward(data_ + at, data_ + size_, data_ + size_ + n);
    size_ += n;
    return at;
  }

  T* data_ = inline_;
  size_type size_ = 0;
  size_type capacity_ = N;
  T inline_[N];
};

}  // namespace autograd
